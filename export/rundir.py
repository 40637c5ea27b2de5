"""Reading a run directory (the contract train/ writes) or a bare model file."""

import dataclasses
import os

from export import kinds
from zoo.cli import UsageError
from zoo.rundir import load_json, read_config


@dataclasses.dataclass
class Source:
    """What an exporter works from.

    Attributes:
        path: the run directory or model file given by the user.
        kind: the model kind ("tagger", "seq2seq", ... or "keras" for a bare model).
        run_dir: the run directory, or None for a bare model file / live model.
        config: config.json contents ({} for a bare model).
        model: the loaded Keras model (loaded on first use by `ensure_model`).
        sample_file: the run's file of example rows that `calibration()` reads:
            calibration.npz (training data, for quantization) unless `held_out()`
            chose the test-split rows training saved as evaluation.npz.
    """

    path: str
    kind: str
    run_dir: str | None = None
    config: dict = dataclasses.field(default_factory=dict)
    model: object = None
    sample_file: str = "calibration.npz"

    def file(self, *parts):
        return os.path.join(self.run_dir, *parts) if self.run_dir else None

    def held_out(self):
        """This source reading its rows (inputs and gold labels) from the run's
        held-out evaluation.npz when training wrote one, so accuracy is measured on
        test data; otherwise unchanged (calibration.npz, training data)."""
        path = self.file("evaluation.npz")
        if path and os.path.exists(path):
            return dataclasses.replace(self, sample_file="evaluation.npz")
        return self

    def calibration(self):
        """The run's example rows (`sample_file`) as a dict of arrays, or None."""
        path = self.file(self.sample_file)
        if not path or not os.path.exists(path):
            return None
        import numpy as np

        with np.load(path) as data:
            return {k: data[k] for k in data.files}

    def ensure_model(self):
        """The Keras model, loaded from the run directory on first use."""
        if self.model is None:
            self.model = load_model(os.path.join(self.run_dir, "model.keras"))
        return self.model

    def metrics(self):
        path = self.file("metrics.json")
        return load_json(path) if path and os.path.exists(path) else {}


def load_model(path):
    """`zoo.model_file.load`: safe_mode, and one UsageError for a missing, truncated,
    corrupted or unsafe file."""
    from zoo import model_file

    try:
        return model_file.load(path, compile=False)
    except model_file.ModelFileError as e:
        raise UsageError(str(e)) from None


def resolve(path_or_model):
    """Turns RUN_DIR_OR_MODEL (or a live keras.Model) into a `Source`.

    Raises:
        UsageError: the path is missing, is not a run directory or model file,
            or its config.json is unreadable.
    """
    import keras

    if isinstance(path_or_model, keras.Model):
        return Source(path="<model>", kind=kinds.detect(path_or_model), model=path_or_model)
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise UsageError(f"no such run directory or model file: {path}")
    if os.path.isfile(path):
        if not path.endswith(".keras"):
            raise UsageError(f"not a run directory or .keras model file: {path}")
        model = load_model(path)
        return Source(path=path, kind=kinds.detect(model), model=model)
    config_path = os.path.join(path, "config.json")
    model_path = os.path.join(path, "model.keras")
    if not os.path.exists(config_path) or not os.path.exists(model_path):
        raise UsageError(f"not a run directory (needs config.json and model.keras): {path}")
    config = read_config(path)
    if "kind" not in config:
        raise UsageError(f'{config_path} has no "kind"')
    return Source(path=path, kind=str(config["kind"]), run_dir=path, config=config)
