"""Length-bucketed batch orders, shared by the commands that batch sequences."""

import numpy as np


def bucketed(lengths, batch_size, seed=None):
    """Row indices in batches of similar lengths (little padding). Without `seed`, sorted
    by length; with one (anything np.random.default_rng takes), random batches in the
    order the seed gives: rows shuffled, sorted by length within pools of 50 batches."""
    n = len(lengths)
    if seed is None:
        order = np.argsort(lengths, kind="stable")
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    pool = batch_size * 50
    batches = []
    for start in range(0, n, pool):
        part = order[start : start + pool]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches
