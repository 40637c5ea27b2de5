"""The `attention-zoo` console script: one command in front of the project's CLIs.

    attention-zoo train MODEL [options]      = python -m train MODEL [options]
    attention-zoo export ACTION [options]    = python -m export ACTION [options]
    attention-zoo tag PATH "sentence" ...    = python -m zoo.tag ...
    attention-zoo translate RUN "text" ...   = python -m zoo.translate ...
    attention-zoo generate PATH --out F.png  = python -m zoo.generate ...

Each subcommand runs the same `main` as its `python -m` form (same flags, exit
codes and one-line errors). The modules are imported by name, on demand, so
`zoo` does not import `train` or `export` otherwise.
"""

import importlib
import sys

COMMANDS = {
    "train": ("train.cli", "train a model (tagger, seq2seq, universal_transformer, sagan)"),
    "export": ("export.__main__", "export a run: savedmodel, tflite, check, verify, bench"),
    "tag": ("zoo.tag", "tag sentences with a tagger run or .tflite file"),
    "translate": ("zoo.translate", "translate text with a seq2seq run"),
    "generate": ("zoo.generate", "generate images with a SAGAN run or .tflite file"),
}


def _usage():
    lines = ["usage: attention-zoo COMMAND [options]   (attention-zoo COMMAND --help)", "commands:"]
    lines += [f"  {name:12s}{help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)  # bare: a usage error
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"error: unknown command {name!r}; choose from: {', '.join(COMMANDS)}", file=sys.stderr
        )
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
