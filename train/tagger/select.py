"""Choose the tagging data from the flags (no TensorFlow import unless tfds is named)."""

import random

from train.tagger import embedded
from train.tagger.conllu import read_conllu
from train.tagger.types import TaggingData
from train.tfds import load_tfds, parse_dataset_flag
from zoo.cli import UsageError


def load_data(cfg):
    """Reads the data the flags in `cfg` name (default: the embedded grammar) into `TaggingData`."""
    files = {"train": cfg.train_file, "dev": cfg.dev_file, "test": cfg.test_file}
    if cfg.dataset and any(files.values()):
        raise UsageError("--dataset cannot be combined with --train-file/--dev-file/--test-file")
    if cfg.dataset:
        data = load_tfds(parse_dataset_flag(cfg.dataset))
    elif any(files.values()):
        if not cfg.train_file:
            raise UsageError("--dev-file/--test-file need --train-file")
        # Read every file before complaining about any split, so errors name files in order.
        splits = {name: read_conllu(path) if path else None for name, path in files.items()}
        data = TaggingData(
            **splits, source={"name": "conllu", **{k: v for k, v in files.items() if v}}
        )
    else:
        data = embedded.generate(seed=cfg.seed)
    _carve_missing(data, cfg.seed)
    data.check_not_empty()
    return data


def _carve_missing(data, seed):
    """Missing dev/test splits are held out from train (10% each), deterministically."""
    missing = [name for name in ("dev", "test") if getattr(data, name) is None]
    if not missing:
        return
    rng = random.Random(seed)
    train = list(data.train)
    rng.shuffle(train)
    size = max(1, len(train) // 10)
    for name in missing:
        setattr(data, name, train[:size])
        train = train[size:]
        data.source[name] = f"held out from train ({size} sentences)"
    data.train = train
