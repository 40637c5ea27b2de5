"""`zoo.load(path)`: a trained model as a task object, whatever form it was saved in.

`path` is a run directory (`python -m train ...`), a `.keras` file, a SavedModel
directory (`python -m export savedmodel`, a TF Serving base or version
directory) or a `.tflite` file with its sidecar `<file>.json`
(`python -m export tflite`). The result is one of:

- `TaggerTask`: `tag(sentences)` -> per sentence, a list of (token, tag) pairs.
- `Translator`: `generate(texts, sampler=..., num_return_sequences=...,
  return_scores=...)` (all samplers from Keras files; greedy only from a
  SavedModel or .tflite file, whose graphs decode greedily), and
  `translate(texts)`.
- `ImageGenerator`: `generate(class_ids, seed=...)` -> float images in [0, 1]
  `[N, S, S, C]`; the same noise as `python -m zoo.generate --seed`.

Each has `.kind`, `.format` ("keras", "savedmodel", "tflite") and, for Keras
files, `.model`. Bad paths and files raise `ValueError` naming the path.
"""

import json
import os

import numpy as np

KINDS = ("tagger", "seq2seq", "universal_transformer", "sagan")


def load(path):
    """Loads a run directory, `.keras` file, SavedModel or `.tflite` file (see module doc)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"`path` does not exist. Received: path={path!r}")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "model.keras")):
            return _from_keras(os.path.join(path, "model.keras"), _read_json(os.path.join(path, "config.json")))
        saved_model = _saved_model_dir(path)
        if saved_model:
            return _from_savedmodel(saved_model)
        raise ValueError("`path` is a directory without model.keras or saved_model.pb (nor "
                         f"numbered versions holding one). Received: path={path!r}")
    if path.endswith(".keras"):
        sibling = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
        return _from_keras(path, _read_json(sibling))
    if path.endswith(".tflite"):
        return _from_tflite(path)
    raise ValueError("`path` must be a run directory, a .keras file, a SavedModel directory "
                     f"or a .tflite file. Received: path={path!r}")


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
    import zoo

    zoo._import_keras_quietly()


# ---------------------------------------------------------------- keras
def _from_keras(path, config):
    from zoo import model_file
    from zoo.seq2seq import Seq2SeqTransformer
    from zoo.tagger import Tagger

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
            found = [layer.num_classes for layer in model._flatten_layers()
                     if getattr(layer, "num_classes", None)]
            num_classes = found[0] if found else None
        conditional = "label" in inputs

        def run(noise, labels):
            feed = {"noise": noise, "label": labels} if conditional else {"noise": noise}
            image = np.asarray(model(feed, training=False), np.float32)
            return np.clip(image * 0.5 + 0.5, 0.0, 1.0)

        return ImageGenerator(run, latent_dim, num_classes if conditional else None,
                              config.get("class_names") or [], fmt="keras", model=model)
    raise ValueError(f"{path} holds a {type(model).__name__}, which is not a zoo task model "
                     f"(one of {', '.join(KINDS)})")


def _seq2seq_kind(model):
    return "universal_transformer" if type(model).__name__ == "UniversalTransformer" else "seq2seq"


# ---------------------------------------------------------------- savedmodel
def _saved_model_dir(path):
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    versions = [d for d in os.listdir(path) if d.isdigit()
                and os.path.isfile(os.path.join(path, d, "saved_model.pb"))]
    return os.path.join(path, max(versions, key=int)) if versions else None


def _from_savedmodel(path):
    _quiet_keras()
    import tensorflow as tf

    try:
        import tensorflow_text  # noqa: F401  (seq2seq graphs use its SentencePiece kernels)
    except ImportError:
        pass
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # noqa: BLE001  (TF raises many types for bad directories)
        raise ValueError(f"cannot load SavedModel {path}: {' '.join(str(e).split())[:300]}") from None
    signatures = loaded.signatures
    if "tag_tokens" in signatures:
        fn = signatures["tag_tokens"]

        def tag(token_lists):
            width = max(len(t) for t in token_lists)
            rows = [list(t) + [""] * (width - len(t)) for t in token_lists]
            tags = fn(tokens=tf.constant(rows, tf.string))["tags"].numpy()
            return [[(tok, tags[r, i].decode("utf-8")) for i, tok in enumerate(tokens)]
                    for r, tokens in enumerate(token_lists)]

        return TaggerTask(tag, tags=None, fmt="savedmodel", model=loaded)
    if "translate" in signatures:
        fn = signatures["translate"]

        def greedy(texts):
            out = fn(text=tf.constant(texts, tf.string))["translation"].numpy()
            return [t.decode("utf-8") for t in out]

        return Translator(greedy=greedy, fmt="savedmodel", kind="seq2seq", model=loaded)
    if "generate" in signatures:
        fn = signatures["serving_default"]
        specs = fn.structured_input_signature[1]
        conditional = "label" in specs

        def run(noise, labels):
            feed = {"noise": tf.constant(noise)}
            if conditional:
                feed["label"] = tf.constant(labels, tf.int32)
            return fn(**feed)["image"].numpy()

        return ImageGenerator(run, int(specs["noise"].shape[-1]), None, [], fmt="savedmodel",
                              model=loaded, conditional=conditional)
    raise ValueError(f"SavedModel {path} has none of the zoo's signatures "
                     f"(tag_tokens, translate, generate): {sorted(signatures)}")


# ---------------------------------------------------------------- tflite
def _from_tflite(path):
    from zoo.cli_input import UsageError, read_sidecar, tflite_interpreter

    meta = _read_json(path + ".json")
    if not meta:  # `python -m export.kinds.seq2seq` writes one sidecar for its two files
        shared = _read_json(os.path.join(os.path.dirname(os.path.abspath(path)), "seq2seq.tflite.json"))
        if os.path.basename(path) in (shared.get("files") or {}).values():
            meta = shared
    kind = meta.get("kind")
    try:
        if kind == "tagger":
            from zoo.tag import TFLiteTagger

            tagger = TFLiteTagger(path)
            return TaggerTask(tagger, tags=list(tagger.tags), fmt="tflite")
        if kind == "sagan":
            meta = read_sidecar(path, "sagan")
            runner = tflite_interpreter(path).get_signature_runner(meta.get("signature", "serving_default"))
            conditional = bool(meta.get("num_classes"))
            batch_one = runner.get_input_details()["noise"]["shape_signature"][0] == 1

            def run(noise, labels):
                def once(n, y):
                    feed = {"noise": n, "label": y} if conditional else {"noise": n}
                    return runner(**feed)["image"]

                if batch_one:
                    return np.concatenate([once(noise[i:i + 1], labels[i:i + 1]) for i in range(len(noise))])
                return once(noise, labels)

            return ImageGenerator(run, int(meta["latent_dim"]), meta.get("num_classes"),
                                  meta.get("class_names") or [], fmt="tflite")
        if kind in ("seq2seq", "universal_transformer"):
            return _tflite_translator(path, meta, tflite_interpreter(path), kind)
    except UsageError as e:
        raise ValueError(str(e)) from None
    raise ValueError(f"{path}: missing or unknown sidecar {path}.json (kind {kind!r}; "
                     "expected 'tagger', 'seq2seq' or 'sagan')")


def _tflite_translator(path, meta, interpreter, kind):
    """Greedy decoding with a seq2seq .tflite file: the one-file WHILE model
    (`source_ids` -> `tokens`) or the step model (`encode`, `decode_step`, the
    loop run here as an app would)."""
    from zoo.tokenization import EOS_ID, Tokenizer, decode_proto

    if not meta.get("tokenizer"):
        raise ValueError(f"{path}: the sidecar has no tokenizer (exported before it was added); "
                         "re-export, or load the run directory or the SavedModel")
    tokenizer = Tokenizer(decode_proto(meta["tokenizer"]))
    signatures = interpreter.get_signature_list()
    if "decode_step" in signatures:
        encode = interpreter.get_signature_runner("encode")
        step = interpreter.get_signature_runner("decode_step")
        length = int(encode.get_input_details()["source_ids"]["shape"][1])
        cache_shape = step.get_input_details()["self_cache"]["shape"]

        def decode(ids):
            enc = encode(source_ids=ids)
            cache = np.zeros(cache_shape, np.float32)
            token, out = 2, []  # BOS
            for position in range(int(cache_shape[1])):
                result = step(token=np.array([token], np.int32), position=np.array(position, np.int32),
                              cross_cache=enc["cross_cache"], encoder_mask=enc["encoder_mask"],
                              self_cache=cache)
                cache, token = result["self_cache"], int(np.argmax(result["logits"][0]))
                out.append(token)
                if token == EOS_ID:
                    break
            return out
    else:
        runner = interpreter.get_signature_runner(sorted(signatures)[0])
        length = int(runner.get_input_details()["source_ids"]["shape"][1])

        def decode(ids):
            return runner(source_ids=ids)["tokens"][0].tolist()

    def greedy(texts):
        outputs = []
        for i, row in enumerate(tokenizer.encode(texts)):
            if len(row) > length:
                raise ValueError(f"input {i} has {len(row)} tokens, more than the model's {length}: "
                                 f"{texts[i][:60]!r}")
            ids = np.zeros((1, length), np.int32)
            ids[0, :len(row)] = row
            outputs.append(tokenizer.decode([decode(ids)])[0])
        return outputs

    return Translator(greedy=greedy, fmt="tflite", kind=kind)


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
        from zoo.cli_input import UsageError

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
    `Seq2SeqTransformer.generate`. `translate(texts)`: greedy strings."""

    def __init__(self, model=None, greedy=None, fmt="keras", kind="seq2seq"):
        self.model = model
        self._greedy = greedy
        self.format = fmt
        self.kind = kind

    def generate(self, texts, sampler="greedy", num_return_sequences=1, return_scores=False,
                 max_length=None, seed=None):
        if self.format == "keras":
            return self.model.generate(texts, sampler=sampler, num_return_sequences=num_return_sequences,
                                       return_scores=return_scores, max_length=max_length, seed=seed)
        from zoo import samplers

        if not isinstance(samplers.get(sampler), samplers.Greedy) or return_scores \
                or num_return_sequences != 1 or max_length is not None:
            raise ValueError(f"a {self.format} translator decodes greedily inside its graph: only "
                             "sampler='greedy' with one sequence, no scores and the default length. "
                             f"Received: sampler={sampler!r}, num_return_sequences={num_return_sequences}, "
                             f"return_scores={return_scores}, max_length={max_length}")
        single = isinstance(texts, str)
        out = self._greedy([texts] if single else list(texts))
        return out[0] if single else out

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

    def __init__(self, run, latent_dim, num_classes, class_names, fmt, model=None, conditional=None):
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
                    raise ValueError(f"`class_ids` names an unknown class; known: {self.class_names}. "
                                     f"Received: {value!r}")
                value = self.class_names.index(value)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0 \
                    or (self.num_classes and value >= self.num_classes):
                bound = f"[0, {self.num_classes})" if self.num_classes else ">= 0"
                raise ValueError(f"`class_ids` must hold ints in {bound} or class names. Received: {value!r}")
            ids.append(int(value))
        return np.asarray(ids, np.int32)

    def generate(self, class_ids=None, seed=None, num_images=None):
        if self.conditional:
            if class_ids is None or num_images is not None:
                raise ValueError("a class-conditional generator takes `class_ids` (not `num_images`). "
                                 f"Received: class_ids={class_ids!r}, num_images={num_images!r}")
            labels = self._ids([class_ids] if isinstance(class_ids, (int, str, np.integer)) else class_ids)
        else:
            if class_ids is not None:
                raise ValueError(f"this generator is unconditional: pass `num_images`, not "
                                 f"`class_ids`. Received: class_ids={class_ids!r}")
            if isinstance(num_images, bool) or not isinstance(num_images, (int, np.integer)) or num_images < 1:
                raise ValueError(f"`num_images` must be a positive int. Received: num_images={num_images!r}")
            labels = np.zeros(int(num_images), np.int32)
        if len(labels) == 0:
            raise ValueError("`class_ids` is empty")
        noise = np.random.default_rng(seed).standard_normal((len(labels), self.latent_dim)).astype(np.float32)
        return np.asarray(self._run(noise, labels), np.float32)

    def __repr__(self):
        return f"<ImageGenerator format={self.format!r} num_classes={self.num_classes}>"
