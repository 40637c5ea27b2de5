"""Parallel text for sequence-to-sequence training (translation, summarisation).

Readers return lists of `(source, target)` string pairs. Every problem a user can
cause (missing file, bad encoding, mismatched line counts, empty lines, a TSV row
without a tab) is a `DataError` naming the file, the line and the value, which the
CLI reports in one line with exit code 2.
"""

import dataclasses
import gzip
import os
import zlib

from zoo.cli import DataError, UsageError


@dataclasses.dataclass
class ParallelData:
    """Train/dev/test pairs and where they came from (for config.json)."""

    train: list
    dev: list
    test: list
    source: dict
    task: str = "text"  # "text" (BLEU/ROUGE) or an algorithmic task (exact match)
    extra: dict = dataclasses.field(default_factory=dict)  # more test sets, e.g. "long"


def read_lines(path):
    """Lines of a plain or gzip text file (UTF-8), without line ends."""
    if not os.path.isfile(path):
        raise DataError(f"data file not found: {path}")
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        with (gzip.open if gzipped else open)(path, "rt", encoding="utf-8", newline="\n") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start})") from None
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a corrupted .gz body
        raise DataError(f"cannot read {path}: {e}") from None
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()  # one blank last line (a file ending in two line ends) is not a pair
    return lines


def _check_not_empty(path, lines):
    if not lines:
        raise DataError(f"empty data file: {path}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise DataError(f"empty line {number} in {path}")


def read_parallel(source_path, target_path):
    """Line i of `source_path` translates line i of `target_path`."""
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise DataError(
            f"mismatched line counts: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    _check_not_empty(source_path, sources)
    _check_not_empty(target_path, targets)
    return list(zip(sources, targets))


def read_tsv(path):
    """One pair per line: source TAB target."""
    lines = read_lines(path)
    if not lines:
        raise DataError(f"empty data file: {path}")
    pairs = []
    for number, line in enumerate(lines, 1):
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(
                f"line {number} of {path} needs exactly one tab (source<TAB>target), "
                f"found {len(parts) - 1}: {line[:60]!r}"
            )
        if not parts[0].strip() or not parts[1].strip():
            raise DataError(
                f"empty {'source' if not parts[0].strip() else 'target'} on line {number} of {path}"
            )
        pairs.append((parts[0], parts[1]))
    return pairs


def hold_out(pairs, fraction, minimum, maximum, seed):
    """Splits off a random held-out set: (rest, held_out)."""
    import numpy as np

    n = min(maximum, max(minimum, int(len(pairs) * fraction)))
    if len(pairs) < 2 * n:
        raise DataError(f"too little data to hold out {n} pairs: only {len(pairs)} training pairs")
    order = np.random.default_rng(seed).permutation(len(pairs))
    held = set(order[:n].tolist())
    return (
        [p for i, p in enumerate(pairs) if i not in held],
        [p for i, p in enumerate(pairs) if i in held],
    )


def load_tfds(name):
    """A tfds translation or summarisation set (downloads; needs the network).

    Uses the builder's supervised keys (source, target), e.g.
    ted_hrlr_translate/pt_to_en (pt, en), gigaword (document, summary),
    cnn_dailymail (article, highlights)."""
    import tensorflow_datasets as tfds

    from train.tfds import open_builder, read_splits

    builder = open_builder(name)
    keys = builder.info.supervised_keys
    if not keys or len(keys) != 2:
        raise UsageError(f"tfds data set {name!r} has no (source, target) supervised keys")

    def read(split):
        rows = tfds.as_numpy(builder.as_dataset(split=split, as_supervised=True))
        pairs = [(s.decode("utf-8").strip(), t.decode("utf-8").strip()) for s, t in rows]
        return [(s, t) for s, t in pairs if s and t]

    return read_splits(builder, name, read), {"name": f"tfds:{name}", "supervised_keys": list(keys)}
