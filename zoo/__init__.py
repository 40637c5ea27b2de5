"""Model builders of the attention zoo, and `zoo.load` for trained ones.

`zoo.load(path)` returns a task object (tagger, translator, image generator) for
a run directory, `.keras` file, SavedModel or `.tflite` file (`zoo.tasks`).
`zoo.build(name, **kwargs)` builds a registered model; `zoo.names()` lists them.
Importing `zoo` imports `layers` and every zoo model module, so that
`keras.models.load_model` finds all registered classes after `import zoo`.
"""

import importlib
import importlib.util
import os
import sys


def _import_keras_quietly():
    """Imports keras with the process's stderr (fd 2) muted.

    TensorFlow's C++ runtime prints oneDNN INFO lines while keras is imported, before absl
    logging is initialised, so TF_CPP_MIN_LOG_LEVEL does not filter them; the CLIs promise
    one line on stderr for bad input. A failed import still raises its Python exception.
    """
    if "keras" in sys.modules:
        return
    try:
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        sys.stderr.flush()
        os.dup2(devnull, 2)
        import keras  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_import_keras_quietly()

import layers  # noqa: E402,F401  (registers the layers that saved models refer to)

_BUILDERS = {}

# Model modules register their builders on import. Modules that other issues add later
# are imported when present, so this file need not change for each new model.
_MODEL_MODULES = ("zoo.tagger.model", "zoo.seq2seq.transformer", "zoo.seq2seq.universal_transformer", "zoo.sagan.model")


def register(name):
    """Decorator registering `builder(**kwargs) -> keras.Model` under `name`."""

    def decorator(builder):
        if name in _BUILDERS and _BUILDERS[name] is not builder:
            raise ValueError(f"zoo model name already registered: {name!r}")
        _BUILDERS[name] = builder
        return builder

    return decorator


def names():
    """Sorted names accepted by `build`."""
    return sorted(_BUILDERS)


def load(path):
    """A trained model as a task object: see `zoo.tasks.load`."""
    from zoo import tasks

    return tasks.load(path)


def build(name, **kwargs):
    """Builds the zoo model `name` (see `names()`) from keyword arguments."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown zoo model name: {name!r}; known: {', '.join(names())}")
    return _BUILDERS[name](**kwargs)


for _module in _MODEL_MODULES:
    if importlib.util.find_spec(_module) is not None:
        importlib.import_module(_module)
