"""Choose the tagging data from the flags (no TensorFlow import unless tfds is named)."""

import random

from train.tagger import embedded
from train.tagger.conllu import read_conllu
from train.tagger.types import TaggingData
from train.tfds import load_tfds, parse_dataset_flag
from zoo.cli import UsageError


def load_data(train_file=None, dev_file=None, test_file=None, dataset=None, seed=0):
    """Reads the data the flags name (default: the embedded grammar) into `TaggingData`."""
    files = {"train": train_file, "dev": dev_file, "test": test_file}
    if dataset and any(files.values()):
        raise UsageError("--dataset cannot be combined with --train-file/--dev-file/--test-file")
    if dataset:
        data = load_tfds(parse_dataset_flag(dataset))
    elif any(files.values()):
        if not train_file:
            raise UsageError("--dev-file/--test-file need --train-file")
        # Read every file before complaining about any split, so errors name files in order.
        splits = {name: read_conllu(path) if path else None for name, path in files.items()}
        data = TaggingData(
            **splits, source={"name": "conllu", **{k: v for k, v in files.items() if v}}
        )
    else:
        data = embedded.generate(seed=seed)
    _carve_missing(data, seed)
    data.check_not_empty()
    return data


def _carve_missing(data, seed):
    """Missing dev/test splits are held out from train (10% each), deterministically."""
    missing = [name for name in ("dev", "test") if getattr(data, name) is None]
    if not missing or not data.train:
        for name in missing:
            setattr(data, name, [])
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
