"""`zoo.load(path)`: a trained model as a task object, whatever form it was saved in.

`path` is a run directory (`python -m train ...`), a `.keras` file, a SavedModel
directory (`python -m export savedmodel`, a TF Serving base or version
directory) or a `.tflite` file with its sidecar `<file>.json`
(`python -m export tflite`). The result is a `TaggerTask`, a `Translator` or an
`ImageGenerator`: the classes and the `.tflite` loading are `zoo.lite`'s
(TensorFlow-free; its docstring says what every input gives, the classes' what
their methods do). Each object has `.kind`, `.format` ("keras", "savedmodel",
"tflite") and, for Keras files, `.model`. Bad paths and files raise
`ValueError` naming the path.
"""

import os

import numpy as np

from zoo import lite, litert
from zoo.cli import UsageError, import_keras_quietly
from zoo.lite import ImageGenerator, TaggerTask, Translator
from zoo.rundir import read_config, run_kind, saved_model_version_dir

KINDS = ("tagger", "seq2seq", "universal_transformer", "sagan")


def load(path):
    """Loads a run directory, `.keras` file, SavedModel or `.tflite` file (see module doc)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"`path` does not exist. Received: path={path!r}")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "model.keras")):
            return _from_keras(os.path.join(path, "model.keras"), read_config(path) or {})
        saved_model = saved_model_version_dir(path)
        if saved_model:
            return _from_savedmodel(saved_model)
        raise ValueError(
            "`path` is a directory without model.keras or saved_model.pb (nor "
            f"numbered versions holding one). Received: path={path!r}"
        )
    if path.endswith(".keras"):
        return _from_keras(path, read_config(os.path.dirname(os.path.abspath(path))) or {})
    if path.endswith(".tflite"):
        try:
            return lite.load(path)
        except UsageError as e:
            raise ValueError(str(e)) from None
    raise ValueError(
        "`path` must be a run directory, a .keras file, a SavedModel directory "
        f"or a .tflite file. Received: path={path!r}"
    )


def load_for_command(path, kind):
    """`load` for a user command (`zoo.tag`, `zoo.translate`, `zoo.generate`):
    checks now that `path` is an export or holds a model file, and returns a
    function that loads it: an export with `zoo.lite` (no Keras), else, once
    the run is found to be of `kind`, its model.keras with Keras imported
    quietly. What fails is a `zoo.cli.UsageError` (one line, exit 2)."""
    if lite.is_export(path):
        return lambda: lite.load(path, kind)
    model_path = os.path.join(path, "model.keras") if os.path.isdir(path) else path
    if not os.path.isfile(model_path):
        raise UsageError(f"no model found: {model_path}")

    def load_keras():
        found = run_kind(path) if os.path.isdir(path) else None
        if found is not None and not lite.same_kind(found, kind):
            raise UsageError(f"{path} is a {found!r} run, not {kind!r}")
        import_keras_quietly()
        try:
            task = load(model_path)
        except ValueError as e:  # zoo.model_file's one line, or not a zoo task model
            raise UsageError(str(e)) from None
        if not lite.same_kind(task.kind, kind):
            raise UsageError(f"{model_path} holds a {task.kind} model, not a {kind} one")
        return task

    return load_keras


# ---------------------------------------------------------------- keras
def _from_keras(path, config):
    from zoo import model_file
    from zoo.seq2seq.transformer import Seq2SeqTransformer
    from zoo.tagger.model import Tagger

    model = model_file.load(path)
    if isinstance(model, Tagger):
        return TaggerTask(model.tag, tags=model.tags, fmt="keras", model=model)
    if isinstance(model, Seq2SeqTransformer):
        return model.translator()
    inputs = model.input if isinstance(model.input, dict) else {}
    if "noise" in inputs:
        conditional = "label" in inputs
        # The class count of the generator's conditional layers (its up-blocks'
        # batch norms, the class embedding), which a standalone .keras file holds too.
        found = [layer.num_classes for layer in model.layers if getattr(layer, "num_classes", None)]

        def run(noise, labels):
            feed = {"noise": noise, "label": labels} if conditional else {"noise": noise}
            image = np.asarray(model(feed, training=False), np.float32)
            return np.clip(image * 0.5 + 0.5, 0.0, 1.0)

        return ImageGenerator(
            run,
            int(inputs["noise"].shape[-1]),
            found[0] if conditional and found else None,
            config.get("class_names") or [],
            fmt="keras",
            model=model,
        )
    raise ValueError(
        f"{path} holds a {type(model).__name__}, which is not a zoo task model "
        f"(one of {', '.join(KINDS)})"
    )


# ---------------------------------------------------------------- savedmodel
def _from_savedmodel(path):
    import_keras_quietly()
    import tensorflow as tf

    try:
        # A BPE model's SavedModel tokenizes with its SentencePiece kernels (the
        # core-op tokenizer rebuilds unigram and char models only).
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
        from zoo.tagger.model import pad_tokens

        fn = signatures["tag_tokens"]

        def tag(token_lists):
            tags = fn(tokens=pad_tokens(token_lists))["tags"].numpy()
            return [
                [(tok, tags[r, i].decode("utf-8")) for i, tok in enumerate(tokens)]
                for r, tokens in enumerate(token_lists)
            ]

        return TaggerTask(tag, tags=None, fmt="savedmodel", model=loaded)
    if "translate" in signatures:
        asset = os.path.join(path, "assets.extra", "spm.model")
        if "decode_step" not in signatures or not os.path.isfile(asset):
            # There has been no release: an export from before the encode /
            # decode_step signatures and the spm.model asset is refused, not decoded.
            raise ValueError(
                f"{path}: a seq2seq SavedModel without the encode / decode_step "
                "signatures or assets.extra/spm.model, written by an earlier exporter; "
                "export its run again (python -m export savedmodel RUN)"
            )
        from zoo.seq2seq.tokenization import Tokenizer

        with open(asset, "rb") as f:
            tokenizer = Tokenizer(f.read())
        steps = _savedmodel_steps(signatures)
        return Translator(
            steps.generate_ids, tokenizer, steps.max_source_length, "savedmodel", model=loaded
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


def _savedmodel_steps(signatures):
    """A seq2seq SavedModel's `encode` / `decode_step` signatures (steps.tflite's
    functions) as a `zoo.litert.StepModel`."""
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
    return litert.StepModel(
        encode,
        step,
        encode_specs["source_ids"].shape[1],
        step_specs["self_cache"].shape,
        logits.shape[-1],
    )
