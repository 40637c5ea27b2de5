"""Beam width and length penalty chosen on the dev set: sacreBLEU of a translator run
under each setting on the dev split, then on the test split for the run's own setting
and for the dev's best.

    python -m benchmarks.translation_decoding RUN DEV.src DEV.ref TEST.src TEST.ref
        [--settings 1:0.6,4:0.6,4:1.0,8:0.6,8:1.0,4:0.3]

Files are one sentence a line, plain or .gz. Prints a Markdown table (split, beam
width, length penalty alpha, BLEU, seconds).
"""

import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SETTINGS = "1:0.6,4:0.6,4:1.0,8:0.6,8:1.0,4:0.3"


def settings(text):
    """`"W:A,..."` -> [(beam width, alpha), ...]."""
    out = []
    for item in text.split(","):
        width, alpha = item.split(":")
        out.append((int(width), float(alpha)))
    return out


def scores(task, sources, references, chosen):
    """[{beam, alpha, bleu, seconds}] of `task.translate` under each of `chosen`."""
    import sacrebleu

    rows = []
    for width, alpha in chosen:
        start = time.perf_counter()
        hyps = task.translate(sources, beam_width=width, alpha=alpha)
        bleu = sacrebleu.corpus_bleu(hyps, [references]).score
        rows.append(
            {"beam": width, "alpha": alpha, "bleu": round(bleu, 2),
             "seconds": round(time.perf_counter() - start, 1)}
        )  # fmt: skip
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="seq2seq run directory")
    for name in ("dev_source", "dev_reference", "test_source", "test_reference"):
        parser.add_argument(name)
    parser.add_argument("--settings", default=SETTINGS, help="beam:alpha pairs for the dev")
    args = parser.parse_args(argv)
    import zoo
    import zoo.models  # noqa: F401  (registers the translator for zoo.load)
    from train.seq2seq.parallel import read_lines

    task = zoo.load(args.run)
    with open(os.path.join(args.run, "config.json")) as f:
        recorded = json.load(f)["train"]
    own = (int(recorded["beam_width"]), float(recorded["alpha"]))
    dev = scores(task, read_lines(args.dev_source), read_lines(args.dev_reference),
                 settings(args.settings))  # fmt: skip
    best = max(dev, key=lambda r: r["bleu"])
    test_settings = list(dict.fromkeys([own, (best["beam"], best["alpha"])]))
    test = scores(task, read_lines(args.test_source), read_lines(args.test_reference),
                  test_settings)  # fmt: skip
    print("| split | beam width | alpha | BLEU | seconds |\n|---|---|---|---|---|")
    for split, rows in (("dev", dev), ("test", test)):
        for r in rows:
            print(f"| {split} | {r['beam']} | {r['alpha']:g} | {r['bleu']:.2f} | {r['seconds']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
