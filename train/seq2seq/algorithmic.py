"""The embedded, offline seq2seq data: algorithmic tasks from our own generator.

copy     "cabj"        -> "cabj"
reverse  "cabj"        -> "jbac"
sort     "cabj"        -> "abcj"
addition "482+39"      -> "521"
date     "March 5, 2021" / "05 Mar 2021" / "Friday 5 March 2021" ... -> "2021-03-05"

Training uses lengths `1..N` (--task-length N); the "long" test set uses lengths
`N + 1 .. 2 * N` (generalisation to unseen lengths, the Universal Transformer
paper's claim). Characters are the tokens (a SentencePiece
`char` model), and the metric is exact match of the whole output.
"""

import calendar
import datetime

import numpy as np

TASKS = ("copy", "reverse", "sort", "addition", "date")
ALPHABET = "abcdefghij"


def _number(rng, digits, leading):
    """A uniform number of `digits` digits (without a leading zero when `leading`)."""
    first = int(rng.integers(1 if leading else 0, 10))
    return int(str(first) + "".join(str(d) for d in rng.integers(0, 10, size=digits - 1)))


def _date_text(rng, date):
    month, day, year = calendar.month_name[date.month], date.day, date.year
    formats = [
        f"{month} {day}, {year}",
        f"{day} {month[:3]} {year}",
        f"{day:02d} {month} {year}",
        f"{calendar.day_name[date.weekday()]} {day} {month} {year}",
        f"{month[:3]}. {day} {year}",
        f"{year} {month} {day}",
    ]
    return formats[int(rng.integers(len(formats)))]


def example(task, rng, length):
    """One (source, target) pair of the given length (digits for addition)."""
    if task in ("copy", "reverse", "sort"):
        s = "".join(rng.choice(list(ALPHABET), size=length))
        return s, {"copy": s, "reverse": s[::-1], "sort": "".join(sorted(s))}[task]
    if task == "addition":
        # Digit by digit: numbers of any length (10x the trained ones), past int64.
        a = _number(rng, length, leading=length > 1)
        b = _number(rng, int(rng.integers(1, length + 1)), leading=False)
        return f"{a}+{b}", str(a + b)
    if task == "date":
        start = datetime.date(1950, 1, 1).toordinal()
        date = datetime.date.fromordinal(start + int(rng.integers(0, 100 * 365)))
        return _date_text(rng, date), date.isoformat()
    raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")


def generate(task, n, min_length, max_length, seed):
    """n pairs with lengths uniform in [min_length, max_length]."""
    rng = np.random.default_rng(seed)
    return [example(task, rng, int(rng.integers(min_length, max_length + 1))) for _ in range(n)]


def splits(task, train_size, lengths, ranges, eval_size, seed):
    """Training and dev pairs of `lengths` (lo, hi) and a test set of `eval_size` pairs per
    (lo, hi) of `ranges`, all from `seed`; an unknown task is `example`'s ValueError."""
    lo, hi = lengths
    train = generate(task, train_size, lo, hi, seed)
    dev = generate(task, eval_size, lo, hi, seed + 1)
    tests = [generate(task, eval_size, a, b, seed + 2 + k) for k, (a, b) in enumerate(ranges)]
    return train, dev, tests
