"""tensorflow-datasets reader (`--dataset tfds:NAME`), used only when the user names it.

It downloads on first use, so it needs the network; offline it fails with one clear line.
Tags: the `upos` feature (universal_dependencies/*), else `pos` (conll2003 ...). Tokens
whose tag is "_" (multiword-range rows in universal_dependencies) are not words and are
dropped.
"""

import os

from train.tagger.types import TaggedSentence, TaggingData
from zoo.cli import DataError, UsageError

TAG_FEATURES = ("upos", "pos")
_NOT_A_WORD = ("_", "")


def parse_dataset_flag(value, example="universal_dependencies/en_ewt"):
    """NAME from `--dataset tfds:NAME`; the refusal shows `example`."""
    if not value.startswith("tfds:") or not value[len("tfds:") :].strip():
        raise UsageError(f"--dataset must look like tfds:NAME (e.g. tfds:{example}): {value!r}")
    return value[len("tfds:") :].strip()


def open_builder(name):
    """The tfds builder for `name`; unknown or malformed names are a UsageError."""
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name)
    except tfds.core.registered.DatasetNotFoundError:
        raise UsageError(f"unknown tfds data set: {name!r}") from None
    except Exception as e:  # noqa: BLE001  (bad config names raise various errors)
        raise UsageError(f"cannot open tfds data set {name!r}: {str(e).splitlines()[0]}") from None


def prepare(builder, name):
    """Downloads and prepares the data (the network is needed); failures are a DataError."""
    try:
        builder.download_and_prepare()
    except Exception as e:  # noqa: BLE001
        raise DataError(
            f"cannot download/prepare tfds data set {name!r} (offline?): "
            f"{(str(e).splitlines() or [type(e).__name__])[0][:200]}"
        ) from None


def read_splits(builder, name, read):
    """Downloads the data and reads its train, validation and test splits (those there
    are) with `read(split)`, as ours: train, dev, test; no train split is a DataError."""
    prepare(builder, name)
    available = set(builder.info.splits.keys())
    if "train" not in available:
        raise DataError(f"tfds data set {name!r} has no train split")
    theirs = {"train": "train", "dev": "validation", "test": "test"}
    return {ours: read(split) for ours, split in theirs.items() if split in available}


def load_tfds(name):
    import tensorflow_datasets as tfds

    builder = open_builder(name)
    features = builder.info.features
    if "tokens" not in features:
        raise UsageError(f"tfds data set {name!r} has no 'tokens' feature to tag")
    tag_key = next((k for k in TAG_FEATURES if k in features), None)
    if tag_key is None:
        raise UsageError(f"tfds data set {name!r} has no tag feature ({'/'.join(TAG_FEATURES)})")
    names = features[tag_key].feature.names

    def read(split):
        sentences = []
        for example in tfds.as_numpy(builder.as_dataset(split=split)):
            tokens, tags = [], []
            for token, tag in zip(example["tokens"], example[tag_key]):
                if names[int(tag)] not in _NOT_A_WORD:
                    tokens.append(token.decode("utf-8"))
                    tags.append(names[int(tag)])
            if tokens:
                sentences.append(TaggedSentence(tuple(tokens), tuple(tags)))
        return sentences

    source = {"name": f"tfds:{name}", "data_dir": os.environ.get("TFDS_DATA_DIR")}
    # A missing dev or test split (None) is held out from train.
    return TaggingData(
        **{"dev": None, "test": None, **read_splits(builder, name, read)}, source=source
    )
