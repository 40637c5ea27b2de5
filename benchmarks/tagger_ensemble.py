"""What an ensemble of taggers adds over one: UPOS accuracy of each run directory and of
the average of their tag probabilities, on a CoNLL-U file.

    python -m benchmarks.tagger_ensemble TEST.conllu RUN [RUN ...]

Prints a Markdown table: each run alone, every pair, and (three or more runs) all of
them. The runs must tag with the same tag set (any order); each is loaded with
`zoo.load` and reads the words and characters its own way, so runs of different
architectures and vocabularies combine.
"""

import argparse
import itertools
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def probabilities(run, sentences, batch_size=64):
    """(tags, one [T, tags] array per sentence) of the run's model."""
    import zoo
    from zoo.tagger.model import pad_tokens

    model = zoo.load(run).model
    out = []
    for start in range(0, len(sentences), batch_size):
        chunk = [list(s.tokens) for s in sentences[start : start + batch_size]]
        probs = np.asarray(model.core(model.encode_tf(pad_tokens(chunk)), training=False))
        out += [row[: len(tokens)] for row, tokens in zip(probs, chunk)]
    return list(model.tags), out


def accuracy(tags, members, sentences):
    """Token accuracy of the mean of `members`' probabilities (each a list of [T, tags]
    arrays, columns in the order of `tags`)."""
    right = total = 0
    for k, sentence in enumerate(sentences):
        mean = sum(probs[k] for probs in members)
        predicted = [tags[i] for i in np.argmax(mean, axis=-1)]
        right += sum(p == g for p, g in zip(predicted, sentence.tags))
        total += len(predicted)
    return 100.0 * right / total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conllu", help="CoNLL-U file to tag (UPOS column)")
    parser.add_argument("runs", nargs="+", help="tagger run directories")
    args = parser.parse_args(argv)
    import zoo.models  # noqa: F401  (registers the tagger for zoo.load)
    from train.tagger.conllu import read_conllu

    sentences = read_conllu(args.conllu)
    loaded = [probabilities(run, sentences) for run in args.runs]
    tags = loaded[0][0]
    if any(sorted(own) != sorted(tags) for own, _ in loaded):
        sys.exit("the runs tag with different tag sets")
    # Every run's columns in the first run's tag order, once.
    members = [[p[:, [own.index(t) for t in tags]] for p in probs] for own, probs in loaded]
    names = [os.path.basename(os.path.normpath(run)) for run in args.runs]
    groups = [(i,) for i in range(len(names))]
    groups += list(itertools.combinations(range(len(names)), 2))
    groups += [tuple(range(len(names)))] if len(names) > 2 else []
    print("| runs averaged | UPOS accuracy |\n|---|---|")
    for group in groups:
        score = accuracy(tags, [members[i] for i in group], sentences)
        print(f"| {' + '.join(names[i] for i in group)} | {score:.2f} |")


if __name__ == "__main__":
    main()
