"""`zoo.load(path)`: a trained model as a task object, whatever form it was saved in.

`path` is a run directory (`python -m train ...`), a `.keras` file, a SavedModel
directory (`python -m export savedmodel`, a TF Serving base or version
directory) or a `.tflite` file with its sidecar `<file>.json`
(`python -m export tflite`). The result is one of:

- `TaggerTask`: `tag(sentences)` -> per sentence, a list of (token, tag) pairs.
- `Translator`: `generate(texts, sampler=..., num_return_sequences=...,
  return_scores=...)` (all samplers from Keras files, from `steps.tflite` and
  from a SavedModel, whose `encode` / `decode_step` signatures are driven step
  by step; greedy only from a one-file `greedy.tflite` or a SavedModel
  exported without those signatures, whose graphs decode greedily), and
  `translate(texts)`.
- `ImageGenerator`: `generate(class_ids, seed=...)` -> float images in [0, 1]
  `[N, S, S, C]`; the same noise as `python -m zoo.generate --seed`.

Each has `.kind`, `.format` ("keras", "savedmodel", "tflite") and, for Keras
files, `.model`. Bad paths and files raise `ValueError` naming the path.
"""

import json
import os

import numpy as np

from zoo.rundir import saved_model_version_dir

KINDS = ("tagger", "seq2seq", "universal_transformer", "sagan")


def load(path):
    """Loads a run directory, `.keras` file, SavedModel or `.tflite` file (see module doc)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"`path` does not exist. Received: path={path!r}")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "model.keras")):
            return _from_keras(
                os.path.join(path, "model.keras"), _read_json(os.path.join(path, "config.json"))
            )
        saved_model = saved_model_version_dir(path)
        if saved_model:
            return _from_savedmodel(saved_model)
        raise ValueError(
            "`path` is a directory without model.keras or saved_model.pb (nor "
            f"numbered versions holding one). Received: path={path!r}"
        )
    if path.endswith(".keras"):
        sibling = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
        return _from_keras(path, _read_json(sibling))
    if path.endswith(".tflite"):
        return _from_tflite(path)
    raise ValueError(
        "`path` must be a run directory, a .keras file, a SavedModel directory "
        f"or a .tflite file. Received: path={path!r}"
    )


def _read_json(path):
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _quiet_keras():
    from zoo.cli import import_keras_quietly

    import_keras_quietly()


# ---------------------------------------------------------------- keras
def _from_keras(path, config):
    from zoo import model_file
    from zoo.seq2seq.transformer import Seq2SeqTransformer
    from zoo.tagger.model import Tagger

    model = model_file.load(path)
    kind = config.get("kind")
    if isinstance(model, Tagger):
        return TaggerTask(model.tag, tags=model.tags, fmt="keras", model=model)
    if isinstance(model, Seq2SeqTransformer):
        return Translator(model=model, fmt="keras", kind=kind or _seq2seq_kind(model))
    inputs = model.input if isinstance(model.input, dict) else {}
    if "noise" in inputs:
        cfg = config.get("model", {}) if kind == "sagan" else {}
        latent_dim = int(inputs["noise"].shape[-1])
        num_classes = cfg.get("num_classes")
        if "label" in inputs and not num_classes:
            found = [
                layer.num_classes
                for layer in model._flatten_layers()
                if getattr(layer, "num_classes", None)
            ]
            num_classes = found[0] if found else None
        conditional = "label" in inputs

        def run(noise, labels):
            feed = {"noise": noise, "label": labels} if conditional else {"noise": noise}
            image = np.asarray(model(feed, training=False), np.float32)
            return np.clip(image * 0.5 + 0.5, 0.0, 1.0)

        return ImageGenerator(
            run,
            latent_dim,
            num_classes if conditional else None,
            config.get("class_names") or [],
            fmt="keras",
            model=model,
        )
    raise ValueError(
        f"{path} holds a {type(model).__name__}, which is not a zoo task model "
        f"(one of {', '.join(KINDS)})"
    )


def _seq2seq_kind(model):
    return "universal_transformer" if type(model).__name__ == "UniversalTransformer" else "seq2seq"


# ---------------------------------------------------------------- savedmodel
def _from_savedmodel(path):
    _quiet_keras()
    import tensorflow as tf

    try:
        # Only SavedModels exported before the core-op tokenizer (or of BPE
        # models) use its SentencePiece kernels.
        import tensorflow_text  # noqa: F401
    except ImportError:
        pass
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # noqa: BLE001  (TF raises many types for bad directories)
        raise ValueError(
            f"cannot load SavedModel {path}: {' '.join(str(e).split())[:300]}"
        ) from None
    signatures = loaded.signatures
    if "tag_tokens" in signatures:
        fn = signatures["tag_tokens"]

        def tag(token_lists):
            width = max(len(t) for t in token_lists)
            rows = [list(t) + [""] * (width - len(t)) for t in token_lists]
            tags = fn(tokens=tf.constant(rows, tf.string))["tags"].numpy()
            return [
                [(tok, tags[r, i].decode("utf-8")) for i, tok in enumerate(tokens)]
                for r, tokens in enumerate(token_lists)
            ]

        return TaggerTask(tag, tags=None, fmt="savedmodel", model=loaded)
    if "translate" in signatures and "decode_step" in signatures:
        tokenizer = _savedmodel_tokenizer(path)
        if tokenizer is not None:
            return Translator(
                fmt="savedmodel",
                kind="seq2seq",
                model=loaded,
                tokenizer=tokenizer,
                steps=SignatureSteps.from_savedmodel(signatures),
            )
    if "translate" in signatures:
        fn = signatures["translate"]

        def greedy(texts):
            out = fn(text=tf.constant(texts, tf.string))["translation"].numpy()
            return [t.decode("utf-8") for t in out]

        return Translator(
            greedy=greedy,
            fmt="savedmodel",
            kind="seq2seq",
            model=loaded,
            greedy_only="a SavedModel's translate signature decodes greedily inside its "
            "graph (it exports no encode / decode_step signatures: exported "
            "before they were added; export it again)",
        )
    if "generate" in signatures:
        fn = signatures["serving_default"]
        specs = fn.structured_input_signature[1]
        conditional = "label" in specs

        def run(noise, labels):
            feed = {"noise": tf.constant(noise)}
            if conditional:
                feed["label"] = tf.constant(labels, tf.int32)
            return fn(**feed)["image"].numpy()

        return ImageGenerator(
            run,
            int(specs["noise"].shape[-1]),
            None,
            [],
            fmt="savedmodel",
            model=loaded,
            conditional=conditional,
        )
    raise ValueError(
        f"SavedModel {path} has none of the zoo's signatures "
        f"(tag_tokens, translate, generate): {sorted(signatures)}"
    )


# ---------------------------------------------------------------- tflite
def _from_tflite(path):
    from zoo.cli import UsageError, read_sidecar
    from zoo.litert import interpreter as tflite_interpreter

    meta = _read_json(path + ".json")
    if not meta:  # `python -m export.kinds.seq2seq` writes one sidecar for its two files
        shared = _read_json(
            os.path.join(os.path.dirname(os.path.abspath(path)), "seq2seq.tflite.json")
        )
        if os.path.basename(path) in (shared.get("files") or {}).values():
            meta = shared
    kind = meta.get("kind")
    try:
        if kind == "tagger":
            from zoo.tag import TFLiteTagger

            tagger = TFLiteTagger(path)
            return TaggerTask(tagger, tags=list(tagger.tags), fmt="tflite")
        if kind == "sagan":
            return tflite_image_generator(read_sidecar(path, "sagan"), tflite_interpreter(path))
        if kind in ("seq2seq", "universal_transformer"):
            return _tflite_translator(path, meta, tflite_interpreter(path), kind)
    except UsageError as e:
        raise ValueError(str(e)) from None
    raise ValueError(
        f"{path}: missing or unknown sidecar {path}.json (kind {kind!r}; "
        "expected 'tagger', 'seq2seq' or 'sagan')"
    )


def tflite_image_generator(meta, interpreter):
    """An `ImageGenerator` over a SAGAN generator `.tflite` (its LiteRT `interpreter`
    and sidecar `meta`); NumPy and LiteRT only, so `zoo.lite` serves it too. A static
    batch-1 file runs one image at a time."""
    runner = interpreter.get_signature_runner(meta.get("signature", "serving_default"))
    conditional = bool(meta.get("num_classes"))
    batch_one = runner.get_input_details()["noise"]["shape_signature"][0] == 1

    def run(noise, labels):
        def once(n, y):
            feed = {"noise": n, "label": y} if conditional else {"noise": n}
            return runner(**feed)["image"]

        if batch_one:
            return np.concatenate(
                [once(noise[i : i + 1], labels[i : i + 1]) for i in range(len(noise))]
            )
        return once(noise, labels)

    return ImageGenerator(
        run,
        int(meta["latent_dim"]),
        meta.get("num_classes"),
        meta.get("class_names") or [],
        fmt="tflite",
    )


def _tflite_translator(path, meta, interpreter, kind):
    """A translator over a seq2seq .tflite file: the step model (`encode`,
    `decode_step`; every sampler, the loop run here as an app would) or the
    one-file WHILE model (`source_ids` -> `tokens`; greedy only)."""
    from zoo.seq2seq.tokenization import Tokenizer, decode_proto

    if not meta.get("tokenizer"):
        raise ValueError(
            f"{path}: the sidecar has no tokenizer (exported before it was added); "
            "re-export, or load the run directory or the SavedModel"
        )
    tokenizer = Tokenizer(decode_proto(meta["tokenizer"]))
    signatures = interpreter.get_signature_list()
    if "decode_step" in signatures:
        return Translator(
            fmt="tflite",
            kind=kind,
            steps=SignatureSteps.from_tflite(interpreter),
            tokenizer=tokenizer,
        )
    runner = interpreter.get_signature_runner(sorted(signatures)[0])
    length = int(runner.get_input_details()["source_ids"]["shape"][1])

    def greedy(texts):
        outputs = []
        for row in _source_ids(tokenizer, texts, length):
            ids = np.zeros((1, length), np.int32)
            ids[0, : len(row)] = row
            outputs.append(tokenizer.decode([runner(source_ids=ids)["tokens"][0].tolist()])[0])
        return outputs

    return Translator(
        greedy=greedy,
        fmt="tflite",
        kind=kind,
        greedy_only=f"{os.path.basename(path)} decodes greedily inside one WHILE op "
        "(the step model steps.tflite, written next to it by "
        "`python -m export.kinds.seq2seq`, runs every sampler)",
    )


def _source_ids(tokenizer, texts, length):
    ids = tokenizer.encode(texts)
    for i, row in enumerate(ids):
        if len(row) > length:
            raise ValueError(
                f"input {i} has {len(row)} tokens, more than the model's {length}: "
                f"{texts[i][:60]!r}"
            )
    return ids


def _savedmodel_tokenizer(path):
    """The SentencePiece model of a seq2seq SavedModel (`assets.extra/spm.model`, or
    in older exports the `SentencepieceOp` that its `translate` signature
    tokenizes with), as a `zoo.seq2seq.tokenization.Tokenizer`; None if there
    is none."""
    from tensorflow.core.protobuf import saved_model_pb2

    from zoo.seq2seq.tokenization import Tokenizer

    asset = os.path.join(path, "assets.extra", "spm.model")
    if os.path.isfile(asset):
        with open(asset, "rb") as f:
            return Tokenizer(f.read())

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    for graph in saved.meta_graphs:
        nodes = [n for fn in graph.graph_def.library.function for n in fn.node_def]
        for node in list(graph.graph_def.node) + nodes:
            if node.op == "SentencepieceOp" and node.attr["model"].s:
                return Tokenizer(node.attr["model"].s)
    return None


class SignatureSteps:
    """The exported `encode` / `decode_step` signatures (`steps.tflite`'s, and
    a seq2seq SavedModel's, which has the same inputs and outputs) behind the
    methods that `zoo.seq2seq.decoding`'s loops call on a Keras seq2seq model
    (`encode`, `cross_caches`, `empty_caches`, `decode_step`, and a
    teacher-forced `__call__` for scores), so greedy decoding, beam search with
    n-best and sampling run the same code, step by step, on the exported graphs.

    `encode(**inputs)` and `step(**inputs)` take and return dicts of NumPy
    arrays. The signatures take one row (batch 1), so each step calls
    `decode_step` once per live row; the caches are NumPy arrays with the rows
    in front: cross `[B, 2C, S, H, d]`, self `[B, 2N, L, H, d]`. `L` (the
    exported max_target_length) bounds `max_length`."""

    eager_decoding = True  # `decoding.compiled` runs the loops eagerly, no tf.function
    position = "learned"  # the exported cache length is the longest output

    def __init__(self, encode, step, source_length, cache_shape, vocabulary_size):
        self._encode = encode
        self._step = step
        self.max_source_length = int(source_length)
        self._cache_shape = tuple(int(d) for d in cache_shape)
        self.max_target_length = self._cache_shape[1]
        self.vocabulary_size = int(vocabulary_size)

    @classmethod
    def from_tflite(cls, interpreter):
        encode = interpreter.get_signature_runner("encode")
        step = interpreter.get_signature_runner("decode_step")
        return cls(
            encode,
            step,
            encode.get_input_details()["source_ids"]["shape"][1],
            step.get_input_details()["self_cache"]["shape"],
            step.get_output_details()["logits"]["shape"][-1],
        )

    @classmethod
    def from_savedmodel(cls, signatures):
        import tensorflow as tf

        def runner(fn):
            specs = fn.structured_input_signature[1]

            def run(**inputs):
                feed = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()}
                return {k: v.numpy() for k, v in fn(**feed).items()}

            return run, specs

        encode, encode_specs = runner(signatures["encode"])
        step, step_specs = runner(signatures["decode_step"])
        logits = signatures["decode_step"].structured_outputs["logits"]
        return cls(
            encode,
            step,
            encode_specs["source_ids"].shape[1],
            step_specs["self_cache"].shape,
            logits.shape[-1],
        )

    def encode(self, source_ids):
        """source ids `[B, W]` (0-padded, W may exceed the exported length by
        padding only) -> (cross caches `[B, 2C, S, H, d]`, mask `[B, S]` float)."""
        ids = np.asarray(source_ids, np.int32)
        s = self.max_source_length
        if ids.shape[1] > s and ids[:, s:].any():
            raise ValueError(f"a source has more than the model's {s} tokens")
        padded = np.zeros((len(ids), s), np.int32)
        padded[:, : min(s, ids.shape[1])] = ids[:, :s]
        outs = [self._encode(source_ids=row[None]) for row in padded]
        return (
            np.stack([o["cross_cache"] for o in outs]),
            np.concatenate([o["encoder_mask"] for o in outs]),
        )

    def cross_caches(self, encoded):
        return encoded  # `encode` already returns the projected keys and values

    def empty_caches(self, batch_size, max_length):
        return (np.zeros((int(batch_size), *self._cache_shape), np.float32),)

    def decode_step(self, token_ids, index, self_caches, cross_caches, source_mask):
        tokens = np.asarray(token_ids, np.int32).reshape(-1)
        position = np.asarray(index, np.int32).reshape(())
        cache, cross, mask = (
            np.asarray(x, np.float32) for x in (self_caches[0], cross_caches, source_mask)
        )
        logits, new = [], []
        for r in range(len(tokens)):
            out = self._step(
                token=tokens[r : r + 1],
                position=position,
                cross_cache=cross[r],
                encoder_mask=mask[r : r + 1],
                self_cache=cache[r],
            )
            logits.append(out["logits"][0])
            new.append(out["self_cache"])
        return np.stack(logits), (np.stack(new),)

    def __call__(self, inputs, training=False):
        """Teacher-forced logits `[B, T, V]` for `inputs["target_ids"]` (BOS,
        tokens, padding), as `decoding.sequence_log_probability` asks of a model.
        Positions after every row's last token are left at 0 (it masks them)."""
        encoded, mask = self.encode(inputs["source_ids"])
        targets = np.asarray(inputs["target_ids"], np.int32)
        filled = np.nonzero(targets.any(axis=0))[0]
        steps = min(targets.shape[1], int(filled[-1]) + 1 if len(filled) else 1)
        logits = np.zeros((*targets.shape, self.vocabulary_size), np.float32)
        caches = self.empty_caches(len(targets), None)
        for t in range(steps):
            logits[:, t], caches = self.decode_step(targets[:, t], t, caches, encoded, mask)
        return logits


TFLiteSteps = SignatureSteps  # its name before SavedModels shared it


# ---------------------------------------------------------------- tasks
class TaggerTask:
    """Part-of-speech tagging. `tag(sentences)`: a str (one sentence, split on
    whitespace), or a list of str / token lists -> per sentence, a list of
    (token, tag) pairs."""

    kind = "tagger"

    def __init__(self, tag_tokens, tags, fmt, model=None):
        self._tag_tokens = tag_tokens
        self.tags = tags
        self.format = fmt
        self.model = model

    def tag(self, sentences):
        from zoo.cli import UsageError

        if isinstance(sentences, str):
            sentences = [sentences]
        token_lists = [s.split() if isinstance(s, str) else [str(t) for t in s] for s in sentences]
        for i, tokens in enumerate(token_lists):
            if not tokens:
                raise ValueError(f"sentence {i} is empty. Received: {sentences[i]!r}")
        try:
            return self._tag_tokens(token_lists)
        except UsageError as e:
            raise ValueError(str(e)) from None

    def __repr__(self):
        return f"<TaggerTask format={self.format!r}>"


class Translator:
    """Text to text. `generate(texts, sampler="greedy", num_return_sequences=1,
    return_scores=False, max_length=None, seed=None)`: see
    `Seq2SeqTransformer.generate`; the same samplers, scores and seeded draws
    from a Keras file, from `steps.tflite` and from a SavedModel (their
    `encode` / `decode_step` signatures driven by `zoo.seq2seq.decoding`'s loops;
    outputs equal Keras's up to float rounding). A one-file `greedy.tflite`
    and a SavedModel exported without those signatures (its `translate`
    signature) decode greedily inside their graphs: other samplers, scores
    and `max_length` raise `ValueError` naming the sampler and the format.
    `translate(texts)`: greedy strings."""

    def __init__(
        self,
        model=None,
        greedy=None,
        fmt="keras",
        kind="seq2seq",
        steps=None,
        tokenizer=None,
        greedy_only=None,
    ):
        self.model = model
        self._greedy = greedy
        self._steps = steps
        self._tokenizer = tokenizer
        self._greedy_only = greedy_only or f"a {fmt} translator decodes greedily inside its graph"
        self.format = fmt
        self.kind = kind

    def generate(
        self,
        texts,
        sampler="greedy",
        num_return_sequences=1,
        return_scores=False,
        max_length=None,
        seed=None,
    ):
        if self.format == "keras":
            return self.model.generate(
                texts,
                sampler=sampler,
                num_return_sequences=num_return_sequences,
                return_scores=return_scores,
                max_length=max_length,
                seed=seed,
            )
        from zoo.seq2seq import samplers

        picked = samplers.get(sampler)
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        if self._steps is not None:
            out = self._generate_steps(
                texts, picked, num_return_sequences, return_scores, max_length, seed
            )
        elif (
            not isinstance(picked, samplers.Greedy)
            or return_scores
            or num_return_sequences != 1
            or max_length is not None
        ):
            raise ValueError(
                f"{self._greedy_only}: only sampler='greedy' with one sequence, no "
                "scores and the default length; load the run directory (or steps.tflite) "
                f"for sampler={sampler!r}. Received: sampler={sampler!r}, "
                f"format={self.format!r}, num_return_sequences={num_return_sequences}, "
                f"return_scores={return_scores}, max_length={max_length}"
            )
        else:
            out = self._greedy(texts)
        return out[0] if single else out

    def _generate_steps(
        self, texts, sampler, num_return_sequences, return_scores, max_length, seed
    ):
        from zoo.seq2seq import decoding, samplers

        ids = _source_ids(self._tokenizer, texts, self._steps.max_source_length)
        if isinstance(sampler, samplers.Greedy) and num_return_sequences == 1 and not return_scores:
            return self._tokenizer.decode(
                decoding.decode_ids(self._steps, ids, max_length=max_length)
            )
        found = decoding.generate_ids(
            self._steps, ids, sampler, num_return_sequences, max_length=max_length, seed=seed
        )
        outputs = []
        for candidates in found:
            decoded = self._tokenizer.decode([c[0] for c in candidates])
            pairs = [(text, score) for text, (_, score) in zip(decoded, candidates)]
            outputs.append(pairs if return_scores or num_return_sequences != 1 else pairs[0][0])
        return outputs

    def translate(self, texts):
        return self.generate(texts)

    def __repr__(self):
        return f"<Translator kind={self.kind!r} format={self.format!r}>"


class ImageGenerator:
    """Class-conditional (or unconditional) image generation.
    `generate(class_ids=None, seed=None, num_images=None)` -> float32 images
    `[N, S, S, C]` in [0, 1]. `class_ids`: ids or class names (conditional
    generators); `num_images`: how many (unconditional ones). The noise is
    `numpy.random.default_rng(seed).standard_normal((N, latent_dim))`."""

    kind = "sagan"

    def __init__(
        self, run, latent_dim, num_classes, class_names, fmt, model=None, conditional=None
    ):
        self._run = run
        self.latent_dim = latent_dim
        self.num_classes = num_classes
        self.class_names = list(class_names)
        self.conditional = bool(num_classes) if conditional is None else conditional
        self.format = fmt
        self.model = model

    def _ids(self, class_ids):
        ids = []
        for value in class_ids:
            if isinstance(value, str):
                if value not in self.class_names:
                    raise ValueError(
                        f"`class_ids` names an unknown class; known: {self.class_names}. "
                        f"Received: {value!r}"
                    )
                value = self.class_names.index(value)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or value < 0
                or (self.num_classes and value >= self.num_classes)
            ):
                bound = f"[0, {self.num_classes})" if self.num_classes else ">= 0"
                raise ValueError(
                    f"`class_ids` must hold ints in {bound} or class names. Received: {value!r}"
                )
            ids.append(int(value))
        return np.asarray(ids, np.int32)

    def generate(self, class_ids=None, seed=None, num_images=None):
        if self.conditional:
            if class_ids is None or num_images is not None:
                raise ValueError(
                    "a class-conditional generator takes `class_ids` (not `num_images`). "
                    f"Received: class_ids={class_ids!r}, num_images={num_images!r}"
                )
            labels = self._ids(
                [class_ids] if isinstance(class_ids, (int, str, np.integer)) else class_ids
            )
        else:
            if class_ids is not None:
                raise ValueError(
                    f"this generator is unconditional: pass `num_images`, not "
                    f"`class_ids`. Received: class_ids={class_ids!r}"
                )
            if (
                isinstance(num_images, bool)
                or not isinstance(num_images, (int, np.integer))
                or num_images < 1
            ):
                raise ValueError(
                    f"`num_images` must be a positive int. Received: num_images={num_images!r}"
                )
            labels = np.zeros(int(num_images), np.int32)
        if len(labels) == 0:
            raise ValueError("`class_ids` is empty")
        noise = (
            np.random.default_rng(seed)
            .standard_normal((len(labels), self.latent_dim))
            .astype(np.float32)
        )
        return self.images(noise, labels)

    def images(self, noise, labels):
        """The images for this `noise` `[N, latent_dim]` and these class ids `[N]`
        (ignored by an unconditional generator): float32 `[N, S, S, C]` in [0, 1]."""
        return np.asarray(self._run(noise, labels), np.float32)

    def __repr__(self):
        return f"<ImageGenerator format={self.format!r} num_classes={self.num_classes}>"
