"""Length-bucketed batches (train.buckets) and the widths seq2seq training pads them to:
the longest rows where one trace serves every shape, multiples of 8 where XLA compiles
each shape (--jit-compile) or random positions are drawn over the padded width."""

import numpy as np
import pytest

from tests.support import tiny
from train import buckets
from train.cli import main as train_main
from train.seq2seq.data import Encoded


class _Chars:
    """A tokenizer stand-in: one id per character."""

    def encode(self, texts):
        return [[4 + ord(c) % 20 for c in text] for text in texts]


def _encoded(n=200, seed=0):
    rng = np.random.default_rng(seed)
    pairs = [("a" * rng.integers(1, 30), "b" * rng.integers(1, 30)) for _ in range(n)]
    return Encoded(_Chars(), pairs, 64, 64, "train")


@pytest.mark.parametrize("multiple", [1, 8])
def test_every_row_is_batched_once_padded_to_the_longest_rounded_to_the_multiple(multiple):
    encoded = _encoded()
    batches = buckets.Batches(encoded, 16, seed=3, multiple=multiple)
    seen = np.concatenate(batches.rows)
    assert sorted(seen) == list(range(len(encoded)))
    for rows, (x, y) in zip(batches.rows, batches):
        longest_s = max(len(encoded.sources[i]) for i in rows)
        longest_t = max(len(encoded.targets[i]) for i in rows) + 1  # BOS or EOS
        assert x["source_ids"].shape == (len(rows), -(-longest_s // multiple) * multiple)
        assert x["target_ids"].shape == y.shape == (len(rows), -(-longest_t // multiple) * multiple)
        for row, i in enumerate(rows):  # the row, then padding (id 0)
            n = len(encoded.sources[i])
            assert list(x["source_ids"][row, :n]) == encoded.sources[i]
            assert not x["source_ids"][row, n:].any()


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag", ["--no-jit-compile", "--jit-compile", "--random-positions"], ids=str
)
def test_seq2seq_training_pads_to_the_longest_rows_unless_xla_or_random_positions(
    tmp_path, monkeypatch, flag
):
    seen = []

    class Recording(buckets.Batches):
        def __iter__(self):
            for rows, (x, y) in zip(self.rows, super().__iter__()):
                longest = max(len(self.encoded.sources[i]) for i in rows)
                seen.append((self.seeded, x["source_ids"].shape[1], longest))
                yield x, y

        def __init__(self, encoded, batch_size, seed=None, multiple=8):
            super().__init__(encoded, batch_size, seed, multiple)
            self.seeded = seed is not None  # training's batches; validation's are sorted

    monkeypatch.setattr(buckets, "Batches", Recording)
    flags = [*tiny.SEQ2SEQ, flag]
    assert train_main(["seq2seq", "--out", str(tmp_path / "run"), *flags]) == 0
    train = [(width, longest) for seeded, width, longest in seen if seeded]
    assert train and any(seeded is False for seeded, _, _ in seen)
    if flag != "--no-jit-compile":  # random positions are drawn over the padded width
        assert all(width == -(-longest // 8) * 8 for width, longest in train)
    else:
        assert all(width == longest for width, longest in train)
        assert any(width % 8 for width, _ in train)  # the lengths say which
