"""A TensorFlow-free client for the zoo's TFLite exports.

`zoo.lite.load(path)` runs what `python -m export tflite` and
`python -m export.kinds.seq2seq` write with `ai-edge-litert`, NumPy and
`sentencepiece` only: it imports neither TensorFlow nor Keras (nor any module
of this project but the Keras-free `zoo`, `zoo.cli`, `zoo.litert` and
`zoo.tasks`), so it runs where they are not installed, e.g.
`pip install ai-edge-litert numpy sentencepiece`
on a small server or a Raspberry Pi. It reads the sidecar JSON files the
exports write (`FILE.tflite.json`; `seq2seq.tflite.json` beside `steps.tflite`
and `greedy.tflite`) and, for translation, the SentencePiece model (`spm.model`
beside the files, else the sidecar's base64 copy).

`path` is a `.tflite` file or an export folder holding one model (a folder
written by `python -m export.kinds.seq2seq`, or one `.tflite` file with its
sidecar). The result:

- `LiteTagger.tag(sentences)`: a str or a list of str (split on whitespace)
  or token lists -> per sentence, a list of (token, tag) pairs. The tagger's
  token rules, as `zoo.tagger.encoding.TokenEncoder` writes them: word id =
  index of the token lower-cased with every ASCII digit -> "0" (1 if unknown),
  character ids = index of each character as written (1 if unknown), cut to
  `max_chars`, 0-padded.
- `LiteTranslator.translate(texts, beam_width=1, alpha=0.6, max_length=None)`:
  the app loop over `steps.tflite` (`encode` once, then one `decode_step` per
  token with the KV caches carried in NumPy): greedy, or beam search with the
  GNMT length penalty exactly as `zoo.seq2seq.decoding.beam` ranks and stops.
  Without `max_length` a text of n tokens stops after `2 * ceil8(n) + 10`
  tokens (rounded up to 8, at most the export's length), as the Keras model's
  `translate` does. A lone `greedy.tflite` decodes greedily only.
- `generate(class_ids=None, seed=None, num_images=None)`: float32 images
  `[N, S, S, C]` in [0, 1] from the noise
  `numpy.random.default_rng(seed).standard_normal((N, latent_dim))`: the
  `zoo.tasks.ImageGenerator` that `zoo.load` gives for the same file (it needs
  only NumPy and LiteRT).
"""

import base64
import json
import os
import re

import numpy as np

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_NEG = np.float32(-1e9)
SEQ2SEQ_SIDECAR = "seq2seq.tflite.json"


def load(path):
    """Loads a `.tflite` file or an export folder (see the module docstring)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"`path` does not exist. Received: path={path!r}")
    model_path, meta = _resolve(path)
    kind = meta.get("kind")
    if kind == "tagger":
        return LiteTagger(model_path, meta)
    if kind in ("seq2seq", "universal_transformer"):
        return LiteTranslator(model_path, meta)
    if kind == "sagan":
        # zoo.load's TFLite generator: NumPy and LiteRT only already.
        from zoo.tasks import tflite_image_generator

        return tflite_image_generator(meta, _interpreter(model_path))
    raise ValueError(
        f"{model_path}: sidecar kind {kind!r} is not one of 'tagger', 'seq2seq', 'sagan'"
    )


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable sidecar {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _resolve(path):
    """(the .tflite file to run, its sidecar dict)."""
    if os.path.isdir(path):
        shared = os.path.join(path, SEQ2SEQ_SIDECAR)
        if os.path.isfile(shared):
            meta = _read_json(shared)
            files = meta.get("files") or {}
            for key in ("steps", "greedy"):
                if files.get(key) and os.path.isfile(os.path.join(path, files[key])):
                    return os.path.join(path, files[key]), meta
            raise ValueError(f"{shared} names no .tflite file present in {path}")
        found = sorted(
            n
            for n in os.listdir(path)
            if n.endswith(".tflite") and os.path.isfile(os.path.join(path, n + ".json"))
        )
        if len(found) != 1:
            raise ValueError(
                f"{path} must hold one .tflite file with its .json sidecar "
                f"(or {SEQ2SEQ_SIDECAR}); found {found}"
            )
        path = os.path.join(path, found[0])
    if not path.endswith(".tflite"):
        raise ValueError(
            f"`path` must be a .tflite file or an export folder. Received: path={path!r}"
        )
    if os.path.isfile(path + ".json"):
        return path, _read_json(path + ".json")
    shared = os.path.join(os.path.dirname(os.path.abspath(path)), SEQ2SEQ_SIDECAR)
    if os.path.isfile(shared):
        meta = _read_json(shared)
        if os.path.basename(path) in (meta.get("files") or {}).values():
            return path, meta
    raise ValueError(f"{path}: no sidecar {path}.json (nor {SEQ2SEQ_SIDECAR} naming it)")


def _interpreter(path):
    from zoo.litert import interpreter

    return interpreter(path)


def _sentences(sentences):
    if isinstance(sentences, str):
        sentences = [sentences]
    tokens = [s.split() if isinstance(s, str) else [str(t) for t in s] for s in sentences]
    for i, row in enumerate(tokens):
        if not row:
            raise ValueError(f"sentence {i} is empty. Received: {sentences[i]!r}")
    return tokens


# ---------------------------------------------------------------- tagger
class LiteTagger:
    """Part-of-speech tagging with a tagger `.tflite` (see the module docstring)."""

    kind = "tagger"

    def __init__(self, path, meta):
        try:
            self.tags = list(meta["tags"])
            self.max_len = int(meta["max_len"])
            self.max_chars = int(meta["max_chars"])
            self._words = {w: i for i, w in enumerate(meta["words"]) if i >= 2}
            self._chars = {c: i for i, c in enumerate(meta["chars"]) if i >= 2}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad tagger sidecar for {path}: {type(e).__name__}: {e}") from None
        self.path = path
        interpreter = _interpreter(path)
        self._runner = interpreter.get_signature_runner(
            next(iter(interpreter.get_signature_list()))
        )
        shape = self._runner.get_input_details()["word_ids"]["shape_signature"]
        self.static_length = int(shape[1]) if shape[1] > 0 else None

    def word_id(self, token):
        if token == "":
            return PAD_ID
        return self._words.get(re.sub("[0-9]", "0", token.lower()), UNK_ID)

    def char_ids(self, token):
        ids = [self._chars.get(c, UNK_ID) for c in token][: self.max_chars]
        return ids + [PAD_ID] * (self.max_chars - len(ids))

    def encode(self, tokens, width):
        """One sentence -> (word_ids int32 [1, width], char_ids int32 [1, width, max_chars])."""
        padded = list(tokens) + [""] * (width - len(tokens))
        words = np.array([[self.word_id(t) for t in padded]], np.int32)
        chars = np.array([[self.char_ids(t) for t in padded]], np.int32)
        return words, chars

    def tag(self, sentences):
        results = []
        for tokens in _sentences(sentences):
            limit = self.static_length or self.max_len
            if len(tokens) > limit:
                raise ValueError(
                    f"sentence has {len(tokens)} tokens, more than the model's {limit}"
                )
            words, chars = self.encode(tokens, self.static_length or len(tokens))
            out = self._runner(word_ids=words, char_ids=chars)
            tag_ids = (
                out["tag_ids"][0] if "tag_ids" in out else np.argmax(out["probabilities"][0], -1)
            )
            results.append([(t, self.tags[int(i)]) for t, i in zip(tokens, tag_ids)])
        return results

    def __repr__(self):
        return f"<LiteTagger {os.path.basename(self.path)!r}>"


# ---------------------------------------------------------------- translator
def _bucket(length, step=8):
    return max(step, -(-length // step) * step)


def _log_softmax(logits):
    logits = np.asarray(logits, np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _top_k(values, k):
    """(values, indices) of the k largest, ties to the lower index (tf.math.top_k's order)."""
    order = np.argsort(-values, kind="stable")[:k]
    return values[order], order


class LiteTranslator:
    """Text to text with a seq2seq TFLite export (see the module docstring)."""

    def __init__(self, path, meta):
        import sentencepiece as spm

        self.path = path
        self.kind = meta.get("kind", "seq2seq")
        beside = os.path.join(
            os.path.dirname(os.path.abspath(path)), meta.get("tokenizer_file") or "spm.model"
        )
        if os.path.isfile(beside):
            with open(beside, "rb") as f:
                proto = f.read()
        elif meta.get("tokenizer"):
            proto = base64.b64decode(meta["tokenizer"])
        else:
            raise ValueError(
                f"{path}: no spm.model beside it and no tokenizer in its sidecar; re-export"
            )
        self.sentencepiece = spm.SentencePieceProcessor(model_proto=proto)
        interpreter = _interpreter(path)
        signatures = interpreter.get_signature_list()
        self.steps = "decode_step" in signatures
        if self.steps:
            self._encode = interpreter.get_signature_runner("encode")
            self._step = interpreter.get_signature_runner("decode_step")
            self.max_source_length = int(self._encode.get_input_details()["source_ids"]["shape"][1])
            self._cache_shape = tuple(
                int(d) for d in self._step.get_input_details()["self_cache"]["shape"]
            )
            self.max_target_length = self._cache_shape[1]
            self.vocabulary_size = int(self._step.get_output_details()["logits"]["shape"][-1])
        else:
            self._greedy = interpreter.get_signature_runner(sorted(signatures)[0])
            self.max_source_length = int(self._greedy.get_input_details()["source_ids"]["shape"][1])
            self.max_target_length = int(meta.get("max_target_length") or 0) or None

    # ------------------------------------------------------------ text
    def encode_text(self, texts):
        ids = [list(row) for row in self.sentencepiece.encode(list(texts))]
        for i, row in enumerate(ids):
            if len(row) > self.max_source_length:
                raise ValueError(
                    f"input {i} has {len(row)} tokens, more than the model's "
                    f"{self.max_source_length}: {texts[i][:60]!r}"
                )
        return ids

    def decode_text(self, rows):
        out = []
        for row in rows:
            row = [int(i) for i in row]
            if EOS_ID in row:
                row = row[: row.index(EOS_ID)]
            out.append(self.sentencepiece.decode([i for i in row if i > BOS_ID]))
        return out

    def translate(self, texts, beam_width=1, alpha=0.6, max_length=None):
        """str or list of str -> str or list of str (greedy, or beam search)."""
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        rows = [
            self.decode_ids(ids, beam_width=beam_width, alpha=alpha, max_length=max_length)
            for ids in self.encode_text(texts)
        ]
        out = self.decode_text(rows)
        return out[0] if single else out

    # ------------------------------------------------------------ ids
    def _limit(self, n, max_length):
        cap = self.max_target_length
        if max_length is not None:
            if (
                isinstance(max_length, bool)
                or not isinstance(max_length, (int, np.integer))
                or max_length < 1
            ):
                raise ValueError(
                    f"`max_length` must be a positive int. Received: max_length={max_length!r}"
                )
            if cap and max_length > cap:
                raise ValueError(
                    f"`max_length` exceeds the export's {cap}. Received: max_length={max_length}"
                )
            return int(max_length)
        limit = _bucket(2 * _bucket(max(1, n)) + 10)
        return min(cap, limit) if cap else limit

    def decode_ids(self, ids, beam_width=1, alpha=0.6, max_length=None):
        """Source ids (one row, no BOS/EOS) -> output ids, cut before EOS."""
        limit = self._limit(len(ids), max_length)
        source = np.zeros((1, self.max_source_length), np.int32)
        source[0, : len(ids)] = ids
        if not self.steps:
            if beam_width != 1:
                raise ValueError(
                    f"{os.path.basename(self.path)} decodes greedily inside one WHILE op; "
                    "load steps.tflite for beam search"
                )
            out = self._greedy(source_ids=source)["tokens"][0].tolist()[:limit]
        elif beam_width == 1:
            out = self._greedy_steps(source, limit)
        else:
            out = self._beam_steps(source, int(beam_width), float(alpha), limit)
        return out[: out.index(EOS_ID)] if EOS_ID in out else out

    def _run_step(self, token, position, encoded, cache):
        out = self._step(
            token=np.array([token], np.int32),
            position=np.array(position, np.int32),
            cross_cache=encoded["cross_cache"],
            encoder_mask=encoded["encoder_mask"],
            self_cache=cache,
        )
        return out["logits"][0], out["self_cache"]

    def _greedy_steps(self, source, limit):
        encoded = self._encode(source_ids=source)
        cache = np.zeros(self._cache_shape, np.float32)
        token, out = BOS_ID, []
        for position in range(limit):
            logits, cache = self._run_step(token, position, encoded, cache)
            token = int(np.argmax(logits))
            out.append(token)
            if token == EOS_ID:
                break
        return out

    def _beam_steps(self, source, k, alpha, limit):
        """`zoo.seq2seq.decoding.beam_candidates` for one input, step by step."""
        vocab = self.vocabulary_size
        if k < 1 or 2 * k > vocab:
            raise ValueError(f"`beam_width` must be in [1, {vocab // 2}]. Received: beam_width={k}")
        encoded = self._encode(source_ids=source)
        caches = np.zeros((k, *self._cache_shape), np.float32)
        alive_logp = np.full(k, _NEG, np.float32)
        alive_logp[0] = 0.0
        alive_seq = np.zeros((k, limit), np.int32)
        finished_seq = np.zeros((k, limit), np.int32)
        finished_score = np.full(k, _NEG, np.float32)
        current = np.full(k, BOS_ID, np.int32)
        done = False
        rank = np.arange(2 * k)
        for i in range(limit):
            if done:
                break
            logits = np.zeros((k, vocab), np.float32)
            new_caches = caches.copy()
            for r in range(k):
                if alive_logp[r] > _NEG / 2:  # an empty slot is never among the 2k best
                    logits[r], new_caches[r] = self._run_step(
                        int(current[r]), i, encoded, caches[r]
                    )
            scores = (alive_logp[:, None] + _log_softmax(logits)).reshape(-1)
            top_logp, top_index = _top_k(scores, 2 * k)
            from_beam, token = top_index // vocab, (top_index % vocab).astype(np.int32)
            candidates = alive_seq[from_beam].copy()
            candidates[:, i] = token
            is_eos = token == EOS_ID
            live_logp, order = _top_k(np.where(is_eos, _NEG, top_logp).astype(np.float32), k)
            alive_seq = candidates[order]
            caches = new_caches[from_beam[order]]
            current = token[order]
            alive_logp = live_logp
            penalty = np.power(
                np.float32((5.0 + np.float32(i + 1)) / np.float32(6.0)), np.float32(alpha)
            )
            eos_score = np.where(is_eos & (rank < k), top_logp / penalty, _NEG).astype(np.float32)
            all_score = np.concatenate([finished_score, eos_score])
            all_seq = np.concatenate([finished_seq, candidates])
            finished_score, order2 = _top_k(all_score, k)
            finished_seq = all_seq[order2]
            done = bool(finished_score[k - 1] >= live_logp[0] / penalty)
        best = finished_seq[0] if finished_score[0] > _NEG / 2 else alive_seq[0]
        return best.tolist()

    def __repr__(self):
        return f"<LiteTranslator {os.path.basename(self.path)!r} kind={self.kind!r}>"
