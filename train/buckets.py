"""Length-bucketed batches, shared by the commands that batch sequences."""

import numpy as np


class Batches:
    """Batches of `encoded` (a split with `lengths` and `batch(rows)`) whose rows have
    similar lengths (little padding). Without `seed`, sorted by length; with one
    (anything np.random.default_rng takes), random batches in the order the seed gives:
    rows shuffled, sorted by length within pools of 50 batches (training makes one per
    epoch). Each batch is padded to a multiple of `multiple` (`encoded.batch`'s)."""

    def __init__(self, encoded, batch_size, seed=None, multiple=8):
        self.encoded, self.multiple = encoded, multiple
        lengths = encoded.lengths
        if seed is None:
            order = np.argsort(lengths, kind="stable")
            self.rows = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
            return
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(lengths))
        pool = batch_size * 50
        self.rows = []
        for start in range(0, len(order), pool):
            part = order[start : start + pool]
            part = part[np.argsort(lengths[part], kind="stable")]
            self.rows += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
        rng.shuffle(self.rows)

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return (self.encoded.batch(rows, multiple=self.multiple) for rows in self.rows)


def sample(encoded, rows, seed, **options):
    """`encoded.batch(picked, **options)` of `rows` distinct rows picked at random by
    `seed` (all of them when fewer): the example inputs written beside a model."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(encoded), size=min(rows, len(encoded)), replace=False)
    return encoded.batch(picked, **options)
