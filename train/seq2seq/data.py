"""Data for `python -m train seq2seq`: loading, tokenization, padded batches."""

import numpy as np

from train import tfds
from train.seq2seq import algorithmic, parallel
from zoo.cli import DataError, UsageError
from zoo.litert import bucket
from zoo.seq2seq.tokenization import BOS_ID, EOS_ID, train_sentencepiece

SPLITS = ("train", "dev", "test")


def load_data(args):
    """`ParallelData` from the flags; every input problem raises before anything is written."""
    names = [f"{split}_{part}" for split in SPLITS for part in ("source", "target")]
    names += [f"{split}_tsv" for split in SPLITS]
    given = {name: getattr(args, name) for name in names if getattr(args, name)}
    if args.dataset:
        name = tfds.parse_dataset_flag(args.dataset, example="ted_hrlr_translate/pt_to_en")
        splits, source = parallel.load_tfds(name)
        return _complete(splits, source, args.seed)
    if given:
        splits = {}
        for split in SPLITS:
            src, tgt = getattr(args, f"{split}_source"), getattr(args, f"{split}_target")
            tsv = getattr(args, f"{split}_tsv")
            if (src is None) != (tgt is None):
                raise UsageError(f"--{split}-source and --{split}-target must be given together")
            if tsv and src:
                raise UsageError(
                    f"give --{split}-tsv or --{split}-source/--{split}-target, not both"
                )
            if src:
                splits[split] = parallel.read_parallel(src, tgt)
            elif tsv:
                splits[split] = parallel.read_tsv(tsv)
        if "train" not in splits:
            raise UsageError(
                "training data missing: give --train-source/--train-target or --train-tsv"
            )
        return _complete(splits, {"name": "files", **given}, args.seed)
    # The test set has the trained lengths, "long" the next n (a date has no length).
    n = args.task_length
    ranges = [(1, n)] + ([] if args.task == "date" else [(n + 1, 2 * n)])
    data, (_, *long) = embedded(args, ranges, 300, task_length=n)
    data.extra = {"long": long[0]} if long else {}
    return data


def embedded(args, ranges, eval_size, **described):
    """The generated pairs of --task (--train-size, --seed): training and dev pairs of the
    lengths ranges[0] and `eval_size` test pairs per (lo, hi) of `ranges`, as the
    `ParallelData` (its test set the first) and every test set; `described`: config.json's
    data entries besides the task, the size and the seed."""
    train, dev, tests = algorithmic.splits(
        args.task, args.train_size, ranges[0], ranges, eval_size, args.seed
    )
    source = {"name": "embedded", "task": args.task, "train_size": args.train_size}
    source.update(described, seed=args.seed)
    return parallel.ParallelData(train, dev, tests[0], source, task=args.task), tests


def _complete(splits, source, seed):
    train = splits["train"]
    for offset, name in enumerate(("test", "dev")):  # the test set first, from `seed`
        if name not in splits:
            train, splits[name] = parallel.hold_out(train, 0.05, 100, 1000, seed + offset)
            source[name] = "held out from train"
    return parallel.ParallelData(train, splits["dev"], splits["test"], source, task="text")


def train_tokenizer(data, vocab_size):
    """A joint SentencePiece model from the training pairs (source and target)."""
    texts = [s for pair in data.train for s in pair]
    if data.task == "text":
        return train_sentencepiece(texts, vocab_size=vocab_size, model_type="unigram")
    # Algorithmic tasks: characters are the tokens, exactly as written.
    return train_sentencepiece(
        texts,
        vocab_size=vocab_size,
        model_type="char",
        normalization="identity",
        add_dummy_prefix=False,
    )


class Encoded:
    """Token ids of one split: sources, decoder inputs (BOS + y) and labels (y + EOS)."""

    def __init__(
        self, tokenizer, pairs, max_source_length, max_target_length, name, truncate=False
    ):
        self.sources = tokenizer.encode([s for s, _ in pairs])
        targets = tokenizer.encode([t for _, t in pairs])
        for i, (s, t) in enumerate(zip(self.sources, targets)):
            sides = (
                (0, "source", len(s), max_source_length),
                (1, "target", len(t) + 1, max_target_length),
            )
            for side, which, n, limit in sides:
                if n > limit and not truncate:
                    raise DataError(
                        f"{name} pair {i + 1} has a {which} of {n} tokens, over the limit {limit} "
                        f"(raise --max-{which}-length or pass --truncate): {pairs[i][side][:60]!r}"
                    )
            self.sources[i] = s[:max_source_length]
            targets[i] = t[: max_target_length - 1]
        self.targets = targets
        self.lengths = np.array([len(s) + len(t) for s, t in zip(self.sources, targets)])

    def __len__(self):
        return len(self.sources)

    def batch(self, index, widths=None, multiple=8):
        """(inputs, labels) of rows `index`, padded to `widths` (source, target), by
        default the longest of each rounded up to a `multiple` (8: few distinct shapes)."""
        sources = [self.sources[i] for i in index]
        targets = [self.targets[i] for i in index]
        width_s, width_t = widths or (
            bucket(max(len(s) for s in sources), multiple),
            bucket(max(len(t) for t in targets) + 1, multiple),
        )
        x = {
            "source_ids": _pad(sources, width_s),
            "target_ids": _pad([[BOS_ID] + t for t in targets], width_t),
        }
        y = _pad([t + [EOS_ID] for t in targets], width_t)
        return x, y


def _pad(rows, width):
    out = np.zeros((len(rows), width), "int32")
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
