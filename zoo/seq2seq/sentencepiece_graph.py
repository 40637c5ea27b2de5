"""SentencePiece encoding and decoding from core TensorFlow ops only.

A SavedModel that tokenizes with `tensorflow_text`'s `SentencepieceOp` does
not load in the stock `tensorflow_model_server` ("Op type not registered").
`build(proto)` rebuilds what `sentencepiece` (the C++ library behind the
`sentencepiece` Python package) does for the model types this project trains,
from lookup tables, `tf.strings` and `tf.while_loop`:

1. Normalization (`normalizer.cc`): the model's precompiled character map
   (e.g. `nmt_nfkc`), applied left to right with the longest matching rule at
   each position (the map's double-array trie is read into a hash table at
   export time); runs of spaces collapsed and leading / trailing spaces
   removed (`remove_extra_whitespaces`); spaces written as U+2581;
   the dummy "▁" prefix (`add_dummy_prefix`).
2. Segmentation (`unigram_model.cc`, `EncodeOptimized`): Viterbi over the
   pieces and their scores (float32 sums in the library's order; on a tie the
   piece that starts earliest wins, as in the library), a character without a
   one-character piece becomes `<unk>` with score `min_score - 10`, and a run
   of `<unk>`s is merged into one (`sentencepiece_processor.cc`). A `char`
   model is the same with one-character pieces only.
3. Decoding: pieces joined, the first piece's leading "▁"s dropped, "▁" read
   as a space; control pieces are empty, `<unk>` is the model's `unk_surface`
   (" ⁇ ").

Unsupported (raises `NotImplementedError` at construction): `bpe` and `word`
models, byte fallback, user-defined symbols, a denormalizer, whitespace as
suffix, whitespace kept as it is (`remove_extra_whitespaces` or
`escape_whitespaces` off; `train_sentencepiece` leaves both on), and character
maps whose rules write two spaces in a row.
Malformed UTF-8 becomes one U+FFFD per byte, as in sentencepiece.
"""

import struct

import numpy as np
import tensorflow as tf

_UNIGRAM, _BPE, _WORD, _CHAR = 1, 2, 3, 4
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_UNK_PENALTY = 10.0
SPACE = "\u2581"
_NO_RULE = b"\xff"


def charsmap_rules(blob):
    """The rules of a SentencePiece `precompiled_charsmap` as a dict
    `bytes -> bytes` (input sequence -> its normalized form).

    The blob is `<uint32 trie size><darts-clone double array><normalized
    strings, each ending with NUL>`; every key of the double array is walked
    (darts-clone's unit layout: has_leaf bit 8, label = low byte plus bit 31,
    offset = (unit >> 10) << ((unit & 512) >> 6), value = the low 31 bits of
    the leaf unit)."""
    if not blob:
        return {}
    size = struct.unpack("<I", blob[:4])[0]
    units = np.frombuffer(blob[4 : 4 + size], dtype="<u4").astype(np.int64)
    normalized = blob[4 + size :]
    n = len(units)

    labels = units & ((1 << 31) | 0xFF)
    offsets = (units >> 10) << ((units & (1 << 9)) >> 6)
    # A unit u is child c of node p when its label is c and u == p ^ c: group
    # every unit under the node it would be the child of (the same test as a
    # walk that tries all 255 labels at each node, done once for all units).
    candidates = np.nonzero((labels >= 1) & (labels <= 255))[0]
    parents = candidates ^ labels[candidates]
    order = np.argsort(parents, kind="stable")
    candidates, parents = candidates[order], parents[order]
    bounds = np.searchsorted(parents, np.arange(n + 1))
    rules = {}
    stack = [(int(offsets[0]), b"")]
    while stack:
        pos, key = stack.pop()
        if pos >= n:
            continue
        for child in candidates[bounds[pos] : bounds[pos + 1]]:
            unit = int(units[child])
            c = unit & 0xFF
            nxt = child ^ int(offsets[child])
            if (unit >> 8) & 1:
                start = int(units[nxt]) & ((1 << 31) - 1)
                rules[key + bytes([c])] = normalized[start : normalized.index(b"\0", start)]
            stack.append((nxt, key + bytes([c])))
    return rules


def check_supported(proto):
    """Raises NotImplementedError naming what `build` cannot reproduce in core
    ops; returns (the parsed ModelProto, its `charsmap_rules`) otherwise."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(bytes(proto))
    trainer, norm = model.trainer_spec, model.normalizer_spec
    problems = []
    if trainer.model_type not in (_UNIGRAM, _CHAR):
        problems.append(
            f"model type {sentencepiece_model_pb2.TrainerSpec.ModelType.Name(trainer.model_type)}"
        )
    if trainer.byte_fallback:
        problems.append("byte fallback")
    if trainer.treat_whitespace_as_suffix:
        problems.append("whitespace as suffix")
    if any(p.type in (_USER_DEFINED, _BYTE) for p in model.pieces):
        problems.append("user-defined or byte pieces")
    if trainer.model_type == _CHAR and any(p.type == _UNUSED for p in model.pieces):
        problems.append("unused pieces in a char model")
    if model.denormalizer_spec.precompiled_charsmap:
        problems.append("a denormalizer")
    if not (norm.remove_extra_whitespaces and norm.escape_whitespaces):
        problems.append("whitespace kept as it is")
    rules = charsmap_rules(norm.precompiled_charsmap)
    # Runs of spaces collapse by a regex over the joined text, which equals the
    # library's rule-by-rule stripping only if no rule writes two spaces.
    if any(b"  " in v for v in rules.values()):
        problems.append("character-map rules that write two spaces")
    if problems:
        raise NotImplementedError(
            "the core-op SentencePiece supports unigram and char models without "
            f"{', '.join(problems)}"
        )
    return model, rules


def build(proto):
    """A `tf.Module` with `normalize(texts)`, `tokenize(texts) -> RaggedTensor
    int32` and `detokenize(ids) -> string`, giving the `sentencepiece`
    package's ids and strings from core ops; `proto` is the model's bytes.

    Args:
        proto: bytes, a serialized SentencePiece `ModelProto`.
    """
    proto = bytes(proto)
    model, rules = check_supported(proto)
    trainer, norm = model.trainer_spec, model.normalizer_spec
    # A one-character rule that writes its own input changes nothing.
    rules = {k: v for k, v in rules.items() if not (k == v and len(k.decode("utf-8")) == 1)}
    pieces = [p.piece for p in model.pieces]
    types = [p.type for p in model.pieces]
    normal = [i for i, t in enumerate(types) if t == _NORMAL]
    unk_id = next(i for i, t in enumerate(types) if t == _UNKNOWN)
    min_score = min(np.float32(model.pieces[i].score) for i in normal) if normal else np.float32(0)
    unk_score = np.float32(min_score - np.float32(_UNK_PENALTY))

    class _Tokenizer(tf.Module):
        def __init__(self):
            super().__init__(name="sentencepiece_graph")
            self.max_rule_chars = max((len(k.decode("utf-8")) for k in rules), default=0)
            if rules:
                # Input sequence -> its normalized form; a miss gives _NO_RULE,
                # which no rule writes (it is not UTF-8).
                self._rules = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant(list(rules), tf.string),
                        tf.constant(list(rules.values()), tf.string),
                    ),
                    _NO_RULE,
                )
            matchable = (
                normal
                if trainer.model_type == _UNIGRAM
                else [i for i in normal if len(pieces[i]) == 1]
            )
            self.max_piece_chars = max((len(pieces[i]) for i in matchable), default=1)
            self._pieces_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant([pieces[i] for i in matchable], tf.string),
                    tf.constant(matchable, tf.int64),
                ),
                -1,
            )
            self._scores = tf.constant([p.score for p in model.pieces], tf.float32)
            self._pieces = tf.constant(pieces, tf.string)
            self._types = tf.constant(types, tf.int32)

        # ------------------------------------------------------------ encode
        # Graph ops only (explicit while_loops): nothing for AutoGraph to convert.
        @tf.autograph.experimental.do_not_convert
        def normalize(self, texts):
            """string [B] -> string [B], `sentencepiece`'s normalized text."""
            # Malformed bytes match no rule (every rule is valid UTF-8) and are
            # written as U+FFFD.
            chars, shown, lengths = _decoded_chars(tf.convert_to_tensor(texts, tf.string))
            if not self.max_rule_chars:
                texts = tf.strings.reduce_join(shown, axis=1)
            else:
                width = tf.shape(chars)[1]
                k_max = self.max_rule_chars
                matched_len = tf.zeros_like(lengths[:, None] + tf.range(width)[None, :])
                value = shown
                for k in range(1, k_max + 1):
                    written = self._rules.lookup(_windows(chars, k))
                    valid = (tf.range(width)[None, :] + k <= lengths[:, None]) & tf.not_equal(
                        written, _NO_RULE
                    )
                    matched_len = tf.where(valid, k, matched_len)
                    value = tf.where(valid, written, value)
                starts = _greedy_starts(tf.maximum(matched_len, 1), lengths)
                texts = tf.strings.reduce_join(tf.where(starts, value, ""), axis=1)
            texts = tf.strings.regex_replace(texts, " +", " ")
            texts = tf.strings.regex_replace(texts, "^ ", "")
            texts = tf.strings.regex_replace(texts, " ", SPACE)
            if norm.add_dummy_prefix:
                texts = tf.strings.join([SPACE, texts])
            return tf.strings.regex_replace(texts, f"({SPACE})+$", "")

        @tf.autograph.experimental.do_not_convert
        def tokenize(self, texts):
            """string [B] -> int32 RaggedTensor [B, None], `sentencepiece`'s ids."""
            ragged = tf.strings.unicode_split(
                self.normalize(texts), "UTF-8", errors="replace", replacement_char=0xFFFD
            )
            chars = ragged.to_tensor(default_value="", shape=[None, None])
            lengths = tf.cast(ragged.row_lengths(), tf.int32)
            batch, width = tf.shape(chars)[0], tf.shape(chars)[1]
            positions = tf.range(width)[None, :]
            neg_inf = tf.constant(-np.inf, tf.float32)
            # Candidates by end position (candidate (end j, k) starts at j - k), one
            # per length k = K..1 (the library's order of arrival at an end
            # position: earliest start first).
            ids, scores = [], []
            for k in range(self.max_piece_chars, 0, -1):
                piece_id = self._pieces_table.lookup(_windows(chars, k))
                valid = (positions + k <= lengths[:, None]) & (piece_id >= 0)
                score = tf.where(valid, tf.gather(self._scores, tf.maximum(piece_id, 0)), neg_inf)
                if k == 1:  # no one-character piece: <unk>
                    unknown = (positions < lengths[:, None]) & (piece_id < 0)
                    score = tf.where(unknown, unk_score, score)
                    piece_id = tf.where(unknown, tf.cast(unk_id, piece_id.dtype), piece_id)
                ids.append(_shift_right(tf.cast(piece_id, tf.int32), k, -1))
                scores.append(_shift_right(score, k, neg_inf))
            lengths_k = tf.constant(list(range(self.max_piece_chars, 0, -1)), tf.int32)
            end_scores, end_ids = tf.stack(scores, axis=2), tf.stack(ids, axis=2)

            def step(j, best, back):
                prev_index = j - lengths_k
                prev = tf.gather(best, tf.maximum(prev_index, 0), axis=1)
                total = tf.where(prev_index[None, :] >= 0, prev + end_scores[:, j - 1, :], neg_inf)
                choice = tf.argmax(total, axis=1, output_type=tf.int32)
                at_j = tf.equal(tf.range(width + 1)[None, :], j)
                best = tf.where(at_j, tf.reduce_max(total, axis=1)[:, None], best)
                back = tf.where(at_j, choice[:, None], back)
                return j + 1, best, back

            best0 = tf.zeros([batch, width + 1], tf.float32)
            back0 = tf.zeros([batch, width + 1], tf.int32)
            _, _, back = tf.while_loop(
                lambda j, *_: j <= width, step, [tf.constant(1), best0, back0]
            )

            # Backtrack from each row's end, marking the ends of the best path.
            def trace(t, pos, ends):
                live = pos > 0
                mark = tf.equal(tf.range(width + 1)[None, :], pos[:, None]) & live[:, None]
                ends = ends | mark
                k = tf.gather(lengths_k, tf.gather(back, pos, batch_dims=1))
                return t + 1, tf.where(live, pos - k, pos), ends

            _, _, ends = tf.while_loop(
                lambda t, pos, ends: tf.reduce_any(pos > 0),
                trace,
                [tf.constant(0), lengths, tf.zeros([batch, width + 1], tf.bool)],
            )
            choice = tf.gather(back, tf.range(1, width + 1), axis=1)
            chosen = tf.gather(end_ids, choice, batch_dims=2)
            found = tf.ragged.boolean_mask(chosen, ends[:, 1:])
            # A run of <unk>s is one <unk>.
            dense = found.to_tensor(default_value=-1)
            previous = tf.pad(dense, [[0, 0], [1, 0]], constant_values=-1)[:, : tf.shape(dense)[1]]
            keep = (dense >= 0) & ~(tf.equal(dense, unk_id) & tf.equal(previous, unk_id))
            return tf.ragged.boolean_mask(dense, keep)

        # ------------------------------------------------------------ decode
        @tf.autograph.experimental.do_not_convert
        def detokenize(self, ids):
            """int32 ids, a RaggedTensor [B, None] or a Tensor [B, L] (every
            id counts) -> string [B], `sentencepiece`'s decoded text."""
            if not isinstance(ids, tf.RaggedTensor):
                ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
            ids = tf.cast(ids, tf.int32)
            # One absent (-1) column more: the argmax below needs a non-empty axis when
            # every row is empty (an output that is EOS at once, an empty batch).
            dense = tf.pad(ids.to_tensor(default_value=-1), [[0, 0], [0, 1]], constant_values=-1)
            present = dense >= 0
            safe = tf.maximum(dense, 0)
            kind = tf.gather(self._types, safe)
            unknown = tf.equal(kind, _UNKNOWN)
            text = tf.where(unknown, trainer.unk_surface, tf.gather(self._pieces, safe))
            visible = present & ~tf.equal(kind, _CONTROL)
            text = tf.where(visible, text, "")
            first = tf.argmax(tf.cast(visible, tf.int32), axis=1, output_type=tf.int32)
            is_first = tf.equal(tf.range(tf.shape(dense)[1])[None, :], first[:, None]) & visible
            stripped = tf.strings.regex_replace(text, f"^({SPACE})+", "")
            text = tf.where(is_first & ~unknown, stripped, text)
            joined = tf.strings.reduce_join(text, axis=1)
            return tf.strings.regex_replace(joined, SPACE, " ")

    return _Tokenizer()


def _decoded_chars(texts):
    """string [B] -> (raw [B, N]: each character's bytes, a malformed sequence's
    bytes as they are; shown [B, N]: the same with a malformed sequence of n bytes
    written as n U+FFFD, as sentencepiece's normalizer writes it (past the
    character map, one U+FFFD per byte); lengths int32 [B])."""
    codes, offsets = tf.strings.unicode_decode_with_offsets(
        texts, "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    starts, rows = offsets.flat_values, offsets.value_rowids()
    next_starts = tf.concat([starts[1:], tf.zeros([1], starts.dtype)], axis=0)
    next_rows = tf.concat([rows[1:], tf.fill([1], tf.constant(-1, rows.dtype))], axis=0)
    ends = tf.where(
        tf.equal(next_rows, rows),
        next_starts,
        tf.cast(tf.gather(tf.strings.length(texts), rows), starts.dtype),
    )
    raw = tf.strings.substr(tf.gather(texts, rows), starts, ends - starts)
    error = tf.equal(codes.flat_values, 0xFFFD) & tf.not_equal(raw, "\ufffd")
    replacement = tf.gather(
        tf.constant(["\ufffd" * n for n in range(5)]), tf.minimum(tf.strings.length(raw), 4)
    )
    shown = tf.where(error, replacement, raw)
    lengths = tf.cast(codes.row_lengths(), tf.int32)

    def dense(values):
        return codes.with_flat_values(values).to_tensor(default_value="", shape=[None, None])

    return dense(raw), dense(shown), lengths


def _windows(chars, k):
    """[B, N] chars -> [B, N]: the k characters starting at each position
    (shorter near the end; callers mask those)."""
    if k == 1:
        return chars
    padded = tf.pad(chars, [[0, 0], [0, k - 1]], constant_values="")
    width = tf.shape(chars)[1]
    return tf.strings.join([padded[:, i : i + width] for i in range(k)])


def _shift_right(values, k, fill):
    """[B, N] start-indexed -> [B, N] indexed by end - 1 (end = start + k)."""
    width = tf.shape(values)[1]
    padded = tf.pad(values, [[0, 0], [k - 1, 0]], constant_values=fill)
    return padded[:, :width]


def _greedy_starts(match_len, lengths):
    """bool [B, N]: where a left-to-right longest-match scan starts a rule
    (match_len >= 1 at every position)."""
    width = tf.shape(match_len)[1]

    def step(i, nxt, starts):
        here = tf.equal(nxt, i) & (i < lengths)
        starts = starts | (tf.equal(tf.range(width)[None, :], i) & here[:, None])
        return i + 1, tf.where(here, i + match_len[:, i], nxt), starts

    _, _, starts = tf.while_loop(
        lambda i, *_: i < width,
        step,
        [tf.constant(0), tf.zeros_like(lengths), tf.zeros_like(match_len, tf.bool)],
    )
    return starts
