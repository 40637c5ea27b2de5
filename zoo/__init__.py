"""Model builders of the attention zoo, and `zoo.load` for trained ones.

`zoo.load(path)` returns a task object (tagger, translator, image generator) for
a run directory, `.keras` file, SavedModel or `.tflite` file (`zoo.tasks`).
`zoo.build(name, **kwargs)` builds a zoo model; `zoo.names()` lists them.

Importing `zoo` imports neither Keras nor TensorFlow, so its Keras-free parts
(configs, the LiteRT client) work where those are not installed. The model
modules load on the first `build`, `names` or `load`; `import zoo.models` loads
them all, after which `keras.models.load_model` finds every class a zoo model
file names without `custom_objects`.
"""

import importlib


def _builders():
    return importlib.import_module("zoo.models").BUILDERS


def names():
    """Sorted names accepted by `build`."""
    return sorted(_builders())


def build(name, **kwargs):
    """Builds the zoo model `name` (see `names()`) from keyword arguments."""
    builders = _builders()
    if name not in builders:
        raise ValueError(f"unknown zoo model name: {name!r}; known: {', '.join(sorted(builders))}")
    return builders[name](**kwargs)


def load(path):
    """A trained model as a task object: see `zoo.tasks.load`."""
    return importlib.import_module("zoo.tasks").load(path)
