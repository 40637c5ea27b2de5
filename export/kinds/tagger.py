"""Export plugin for `zoo.tagger.model.Tagger` (config kind "tagger").

SavedModel signatures (TF Serving):
  serving_default(sentences: string [B])        raw text, split on whitespace
  tag_tokens(tokens: string [B, T], "" padded)   pre-tokenised text
      -> tags string [B, T] ("" past each sentence), tag_ids int32 [B, T] (-1 past
         each sentence), tokens string [B, T], lengths int32 [B]
  predict_ids(word_ids int32 [B, T], char_ids int32 [B, T, max_chars])
      -> probabilities float32 [B, T, num_tags], tag_ids int32 [B, T]
Token -> id rules are the Tagger's own `encode_tf` (one implementation). An empty
batch, or no tokens, gives empty outputs; too long input and bad ids are refused in
our words (docs/deploy.md, "What a signature answers").

TFLite: the id-level core (word_ids, char_ids -> probabilities [+ tag_ids]).
The static-shape (GPU) variant returns probabilities only (one output for the app to
read; LiteRT's GPU accelerator would run ARG_MAX too, docs/facts.md): the app takes the
argmax.
"""

import json

import numpy as np

from export import bundle
from export.kinds import (
    Endpoint,
    ExportKind,
    assert_ids_in_range,
    checked,
    cut_to,
    fit_to_spec,
    pad_empty,
)
from zoo.cli import UsageError

# Every character Python's str.split() splits on, as one RE2 class for
# tf.strings.regex_replace.
WHITESPACE_RE = "[" + "".join(f"\\x{{{c:x}}}" for c in bundle.WHITESPACE) + "]"


class TaggerKind(ExportKind):
    name = "tagger"
    class_output = "probabilities"
    id_signature = "predict_ids"
    expected = "a zoo Tagger"
    model_class = ("zoo.tagger.model", "Tagger")

    def core(self, source):
        return self.model(source).core

    def default_length(self, source):
        return int(self.model(source).max_len)

    def core_specs(self, source, static_length=None):
        import tensorflow as tf

        m = self.model(source)
        if static_length is not None and static_length > m.max_len:
            raise UsageError(f"--length {static_length} exceeds the tagger's max_len {m.max_len}")
        b, t = (1, int(static_length)) if static_length is not None else (None, None)
        return [
            tf.TensorSpec([b, t], tf.int32, name="word_ids"),
            tf.TensorSpec([b, t, m.max_chars], tf.int32, name="char_ids"),
        ]

    def core_fn(self, source, static=False):
        import tensorflow as tf

        core = self.core(source)

        def fn(word_ids, char_ids):
            probs = core({"word_ids": word_ids, "char_ids": char_ids}, training=False)
            out = {"probabilities": probs}
            if not static:
                # tf.argmax, not keras.ops.argmax (that one emits Flex BitwiseAnd).
                out["tag_ids"] = tf.argmax(probs, axis=-1, output_type=tf.int32)
            return out

        return fn

    # ------------------------------------------------------------ serving
    def serving_endpoints(self, source):
        import tensorflow as tf

        m = self.model(source)
        tags = tf.constant(m.tags)
        max_len = int(m.max_len)

        def within_max_len(tensor, what):
            return tf.debugging.assert_less_equal(
                tf.shape(tensor)[1],
                max_len,
                message=f"{what} than max_len ({max_len}), the most this tagger reads",
            )

        def tag_dense(tokens):
            present = tf.not_equal(tokens, "")
            lengths = tf.reduce_sum(tf.cast(present, tf.int32), axis=1)
            tokens = checked(tokens, within_max_len(tokens, "a sentence has more tokens"))
            # An empty batch or a batch of empty sentences: the model runs on one "" row
            # or column, and the outputs are cut back (pad_empty says why).
            padded = pad_empty(tokens, axes=(0, 1))
            probs = m.core(m.encode_tf(padded), training=False)
            tag_ids = tf.argmax(probs, axis=-1, output_type=tf.int32)
            tag_ids = cut_to({"tag_ids": tag_ids}, *tf.unstack(tf.shape(tokens)))["tag_ids"]
            tag_ids = tf.where(present, tag_ids, -1)
            names = tf.where(present, tf.gather(tags, tf.maximum(tag_ids, 0)), "")
            return {"tags": names, "tag_ids": tag_ids, "tokens": tokens, "lengths": lengths}

        def tag_sentences(sentences):
            # Python's str.split() rule (bundle.WHITESPACE): tf.strings.split alone
            # splits on ASCII whitespace only.
            tokens = tf.strings.split(tf.strings.regex_replace(sentences, WHITESPACE_RE, " "))
            width = tf.maximum(tf.cast(tf.reduce_max(tokens.row_lengths()), tf.int32), 1)
            batch = tf.shape(sentences)[0]
            dense = tokens.to_tensor(default_value="", shape=tf.stack([batch, width]))
            return tag_dense(dense)

        def predict_ids(word_ids, char_ids):
            word_ids = checked(
                word_ids,
                within_max_len(word_ids, "word_ids has more positions"),
                tf.debugging.assert_equal(
                    tf.shape(char_ids)[:2],
                    tf.shape(word_ids),
                    message="char_ids must be [batch, time, max_chars] with word_ids' batch and time",
                ),
            )
            word_ids = assert_ids_in_range(word_ids, len(m.words), "word_ids")
            char_ids = assert_ids_in_range(char_ids, len(m.chars), "char_ids")
            out = self.core_fn(source)(
                pad_empty(word_ids, axes=(0, 1)), pad_empty(char_ids, axes=(0, 1))
            )
            return cut_to(out, *tf.unstack(tf.shape(word_ids)))

        sentences = self._example_sentences(source)
        tokens = [s.split() for s in sentences]
        width = max(len(t) for t in tokens)
        padded = [t + [""] * (width - len(t)) for t in tokens]
        specs = self.core_specs(source)
        ids = self.sample_inputs(source, 3, specs=specs)
        return [
            Endpoint(
                "serving_default",
                tag_sentences,
                [tf.TensorSpec([None], tf.string, name="sentences")],
                {"sentences": sentences},
                "raw sentences (whitespace-tokenised) -> tags",
            ),
            Endpoint(
                "tag_tokens",
                tag_dense,
                [tf.TensorSpec([None, None], tf.string, name="tokens")],
                {"tokens": padded},
                'tokens [batch, time] padded with "" -> tags',
            ),
            Endpoint(
                "predict_ids",
                predict_ids,
                specs,
                ids,
                "word_ids, char_ids -> probabilities, tag_ids (the TFLite model's contract)",
            ),
        ]

    def _example_sentences(self, source, n=3):
        """A few real sentences: decoded from calibration.npz, else vocabulary words."""
        m = self.model(source)
        calib = source.calibration()
        sentences = []
        if calib is not None and "char_ids" in calib and "word_ids" in calib:
            for w_row, c_row in zip(calib["word_ids"], calib["char_ids"]):
                words = []
                for w, cs in zip(w_row, c_row):
                    if w == 0:
                        break
                    text = "".join(m.chars[c] for c in cs if c > 1)
                    words.append(text or (m.words[w] if w > 1 else "?"))
                if words:
                    sentences.append(" ".join(words))
                if len(sentences) == n:
                    break
        if not sentences:
            vocab = [w for w in m.words[2:] if w.strip()] or ["?"]
            sentences = [" ".join(vocab[i : i + 4]) for i in range(0, min(len(vocab), 4 * n), 4)]
        return sentences

    # ------------------------------------------------------------ data
    def sample_inputs(self, source, n, specs):
        calib = source.calibration()
        if calib is not None and "word_ids" in calib and "char_ids" in calib:
            # n rows, the stored ones repeated as often as needed
            rows = {
                k: np.resize(calib[k], (n, *calib[k].shape[1:])) for k in ("word_ids", "char_ids")
            }
        else:  # sentences of random vocabulary words, encoded by the tagger's own rules
            from zoo.tagger.model import pad_tokens

            m = self.model(source)
            rng = np.random.default_rng(0)
            vocab = m.words[2:] or ["x"]
            longest = min(int(m.max_len), 12)
            sentences = [
                [vocab[i] for i in rng.integers(0, len(vocab), rng.integers(1, longest + 1))]
                for _ in range(n)
            ]
            rows = {k: np.asarray(v) for k, v in m.encode_tf(pad_tokens(sentences)).items()}
        return {s.name: fit_to_spec(rows[s.name], s) for s in specs}

    def calibration_inputs(self, source, specs):
        rows = len(source.calibration()["word_ids"])
        return self.sample_inputs(source, min(200, rows), specs=specs)  # each stored row once

    def valid_mask(self, inputs):
        return np.asarray(inputs["word_ids"]) > 0

    def metric(self, source, inputs, outputs):
        """Token accuracy against the gold tags stored with calibration.npz."""
        calib = source.calibration()
        if calib is None or "tag_ids" not in calib:
            return None
        gold = calib["tag_ids"]
        n, t = np.asarray(inputs["word_ids"]).shape
        gold = np.resize(gold, (n, gold.shape[1]))  # as sample_inputs repeats
        gold_fit = np.full((n, t), -1, dtype=np.int64)
        w = min(t, gold.shape[1])
        gold_fit[:, :w] = gold[:, :w]
        mask = (np.asarray(inputs["word_ids"]) > 0) & (gold_fit >= 0)
        pred = np.argmax(outputs["probabilities"], axis=-1)
        return ("accuracy", float((pred[mask] == gold_fit[mask]).mean()) if mask.any() else 0.0)

    def sidecar(self, source, static_length=None):
        m = self.model(source)
        return {
            "kind": "tagger",
            "arch": getattr(m, "arch", None),
            "words": list(m.words),
            "chars": list(m.chars),
            "tags": list(m.tags),
            "max_chars": int(m.max_chars),
            "max_len": int(static_length or m.max_len),
        }

    # ------------------------------------------------------------ bundle
    intended_use = (
        "Part-of-speech tagging of whitespace-tokenised sentences in the language and "
        "domain of the training data (see data); one tag per token."
    )
    limitations = (
        "Tokens outside the training vocabulary are read from their characters only; "
        "accuracy on other domains or languages is unmeasured."
    )

    def labels(self, source):
        return list(self.model(source).tags)

    def bundle_extra_files(self, source):
        m = self.model(source)
        body = {"words": list(m.words), "chars": list(m.chars)}
        return {"vocab": ("vocab.json", (json.dumps(body, ensure_ascii=False) + "\n").encode())}

    def preprocessing(self, source, refs):
        from zoo.tagger.model import pad_tokens, split_sentences

        m = self.model(source)
        vocab = refs["vocab"]
        sentences = self._example_sentences(source) + [
            "I SAW 42 Dogs",
            "  Été\tà  Paris 1999\u00a0! ",
            "x" * (int(m.max_chars) + 3),
        ]
        vectors = []  # by this project's own rules (the Tagger's TokenEncoder)
        for text, tokens in zip(sentences, split_sentences(sentences)):
            ids = {"word_ids": [[]], "char_ids": [[]]}
            if tokens:
                ids = m.encode_tf(pad_tokens([tokens]))
            row = {k: np.asarray(v)[0].tolist() for k, v in ids.items()}
            vectors.append(dict(text=text, tokens=tokens, **row))
        return {
            "input": "one sentence (str)",
            "tokenize": {
                "rule": "split on runs of whitespace, no empty tokens (Python str.split())",
                "whitespace": bundle.WHITESPACE,
                "max_tokens": int(m.max_len),
                "longer": "refused (more tokens than the model's max_len)",
            },
            "word_ids": {
                "vocabulary": {"file": vocab, "key": "words"},
                "normalize": ["lowercase", "fold_digits"],
                "lowercase": "Unicode full lower-case mapping, as Python's str.lower() "
                "(TensorFlow's tf.strings.lower(encoding='utf-8') agrees)",
                "fold_digits": 'after lower-casing, every ASCII digit 0-9 becomes "0"',
                "id": "index of the normalised token in the vocabulary, else unknown_id",
                "unknown_id": 1,
                "pad_id": 0,
            },
            "char_ids": {
                "vocabulary": {"file": vocab, "key": "chars"},
                "unit": "one Unicode code point of the token as written (no normalisation)",
                "id": "index of the character in the vocabulary, else unknown_id",
                "unknown_id": 1,
                "pad_id": 0,
                "max_chars": int(m.max_chars),
                "longer": "the first max_chars characters are kept",
            },
            "model_inputs": {
                "word_ids": {"dtype": "int32", "shape": ["batch", "tokens"]},
                "char_ids": {"dtype": "int32", "shape": ["batch", "tokens", int(m.max_chars)]},
                "padding": "positions past a sentence's last token: word id 0, char ids all 0",
            },
            "outputs": {
                "tag_ids": "argmax over the last axis of probabilities",
                "labels": {"file": refs["labels"], "id": "line number, from 0"},
            },
            "test_vectors": vectors,
        }


KIND = TaggerKind()
