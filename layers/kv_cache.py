"""The static-shape KV cache of `MultiHeadAttention` (KerasHub's layout).

A cache is one tensor `[batch, 2, max_length, num_heads, key_dim]` (keys at
`[:, 0]`, values at `[:, 1]`) or the same split into the pair
`(key_cache, value_cache)` of rank-4 tensors, which mobile GPU delegates need.
Every shape stays static while decoding: a step writes its keys and values at
`cache_index` and attends to all positions, the unwritten ones masked, which
is what XLA and TFLite need (docs/facts.md).
"""

import numbers

from keras import ops

from layers.validation import check_shape, known_shape


def is_split(cache):
    """Whether `cache` is the pair `(key_cache, value_cache)`."""
    return isinstance(cache, (tuple, list))


def cache_length(cache):
    """The static `max_length` of either form (None if unknown)."""
    return cache[0].shape[1] if is_split(cache) else cache.shape[2]


def make_cache(keys, values, split=False):
    """A cache of the projected `keys` and `values`, `[batch, length, heads,
    key_dim]` each: the pair with `split`, else one stacked tensor."""
    pair = (keys, values)
    return pair if split else ops.stack(pair, axis=1)


def update_cache(cache, keys, values, cache_index):
    """Writes a step's `keys` and `values` into `cache` at `cache_index`.

    Returns:
        `(all_keys, all_values, new_cache)`: the cache's full keys and values
        with the step's written in, and the cache in the form it came in.
    """
    key_cache, value_cache = read_cache(cache)
    zero = ops.zeros((), "int32")
    start = [zero, ops.cast(cache_index, "int32"), zero, zero]
    keys = ops.slice_update(key_cache, start, ops.cast(keys, key_cache.dtype))
    values = ops.slice_update(value_cache, start, ops.cast(values, value_cache.dtype))
    return keys, values, make_cache(keys, values, split=is_split(cache))


def read_cache(cache):
    """`(keys, values)` of a precomputed (cross-attention) cache."""
    return cache if is_split(cache) else (cache[:, 0], cache[:, 1])


def check_cache_dims(key_dim, value_dim):
    if value_dim != key_dim:
        raise ValueError(
            "A KV cache needs `value_dim == key_dim`. Received: "
            f"key_dim={key_dim}, value_dim={value_dim}"
        )


def check_cache(cache, cache_index, *, batch, query_length, num_heads, key_dim):
    """Validates a call's `cache` and `cache_index` against the query.

    Returns:
        The cache's length (None if unknown or there is no cache).
    """
    if cache is None:
        if cache_index is not None:
            raise ValueError(
                "`cache_index` needs a `cache` to write into. "
                f"Received: cache_index={cache_index}, cache=None"
            )
        return None
    if not is_split(cache):
        check_shape(
            "cache",
            cache,
            (batch, 2, None, num_heads, key_dim),
            "(batch, 2, cache_length, num_heads, key_dim)",
        )
        length = (known_shape(cache) or (None,) * 3)[2]
    elif len(cache) != 2:
        raise ValueError(
            "A split `cache` is the pair (key_cache, value_cache). "
            f"Received: a {type(cache).__name__} of {len(cache)} tensors"
        )
    else:
        lengths = set()
        for name, part in zip(("key_cache", "value_cache"), cache):
            check_shape(
                f"cache ({name})",
                part,
                (batch, None, num_heads, key_dim),
                "(batch, cache_length, num_heads, key_dim)",
            )
            lengths.add((known_shape(part) or (None, None))[1])
        lengths.discard(None)
        if len(lengths) > 1:
            raise ValueError(
                "`key_cache` and `value_cache` must have the same length. Received: "
                f"{known_shape(cache[0])} and {known_shape(cache[1])}"
            )
        length = lengths.pop() if lengths else None
    if isinstance(cache_index, numbers.Integral) and length is not None:
        if cache_index < 0 or (query_length is not None and cache_index + query_length > length):
            raise ValueError(
                "`cache_index` + query length must fit in the cache. Received: "
                f"cache_index={cache_index}, query length={query_length}, "
                f"cache length={length}"
            )
    return length
