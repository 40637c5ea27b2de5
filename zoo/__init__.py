"""Model builders of the attention zoo, and `zoo.load` for trained ones.

`zoo.load(path)` returns a task object (tagger, translator, image generator) for
a run directory, `.keras` file, SavedModel or `.tflite` file (`zoo.tasks`).
`zoo.build(name, **kwargs)` builds a registered model; `zoo.names()` lists them.

Importing `zoo` imports neither Keras nor TensorFlow, so its Keras-free parts
(configs, the LiteRT client) work where those are not installed. The model
modules load on the first `build`, `names` or `load`; `import zoo.models` loads
them all, after which `keras.models.load_model` finds every class a zoo model
file names without `custom_objects`.
"""

import importlib

_EXTRA_BUILDERS = {}


def register(name):
    """Decorator registering `builder(**kwargs) -> keras.Model` under `name`, beside
    the zoo's own models (`zoo.models.BUILDERS`)."""

    def decorator(builder):
        if _EXTRA_BUILDERS.get(name, builder) is not builder:
            raise ValueError(f"zoo model name already registered: {name!r}")
        _EXTRA_BUILDERS[name] = builder
        return builder

    return decorator


def _builders():
    builtin = importlib.import_module("zoo.models").BUILDERS
    taken = sorted(set(builtin) & set(_EXTRA_BUILDERS))
    if taken:
        raise ValueError(f"zoo model name already registered: {taken[0]!r}")
    return {**builtin, **_EXTRA_BUILDERS}


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
    tasks = importlib.import_module("zoo.tasks")
    return tasks.load(path)
