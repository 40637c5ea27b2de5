"""`chunk_size="auto"`: whether a call runs block by block (`layers.flash_attention`).

Block by block, no `[Tq, Tk]` tensor is ever built, so memory grows linearly
with the length; `resolve_chunk_size` decides from the static shapes whether
a call is chunked at all.
"""

# `chunk_size="auto"`: chunking turns on when one sequence's float32 scores,
# all heads, would reach AUTO_MIN_ENTRIES entries per head (a 4096 x 4096
# matrix), or the whole batch's AUTO_MAX_BYTES; below that the full path is
# faster (fewer, larger matmuls) and fits.
AUTO_CHUNK_SIZE = 1024
AUTO_MIN_ENTRIES = 4096 * 4096
AUTO_MAX_BYTES = 2**30


def resolve_chunk_size(chunk_size, batch, heads, length_q, length_k, need_weights=False):
    """The block size a call runs with: `None` (full path) or an int.

    `"auto"` decides from the static shapes; a length unknown while tracing
    (a TensorFlow graph with dynamic lengths) keeps the full path, which
    also converts to TFLite without loops, and so do returned weights."""
    if not (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    if need_weights or length_q is None or length_k is None:
        return None
    entries = int(length_q) * int(length_k)
    total = entries * heads * int(batch or 1) * 4
    if entries >= AUTO_MIN_ENTRIES or total >= AUTO_MAX_BYTES:
        return AUTO_CHUNK_SIZE
    return None
