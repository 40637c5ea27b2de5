"""`python -m zoo.translate PATH "text" ["text" ...]`: translate with a trained run.

PATH is a run directory (its model.keras, with the SentencePiece tokenizer
inside; run with Keras) or a seq2seq export (`steps.tflite`, `greedy.tflite` or
the folder `python -m export.kinds.seq2seq` wrote; run with `zoo.lite`, no
TensorFlow). Prints one output line per input. With no text arguments, translates stdin line
by line. `--beam-width N` uses beam search (length penalty `--alpha`).
`--verbose 0`: the translations and errors only (no runtime log lines).
Exit codes: 0 ok, 2 bad input (one line on stderr), 1 unexpected error.
"""

import sys

from zoo.cli import (
    UsageError,
    check_utf8,
    cli_boundary,
    command_parser,
    quiet_stderr,
    verbosity,
)
from zoo.tasks import load_for_command


def _stdin_lines():
    lines = []
    for number, raw in enumerate(sys.stdin.buffer, 1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as e:
            raise UsageError(
                f"stdin line {number} is not valid UTF-8 (byte {e.start}): {raw[:60]!r}"
            ) from None
    return lines


def main(argv=None):
    parser = command_parser("zoo.translate", __doc__)
    parser.add_argument(
        "run_dir", help="seq2seq run directory, .keras file, .tflite file or export folder"
    )
    parser.add_argument("text", nargs="*", help="input text (default: lines of stdin)")
    parser.add_argument("--beam-width", type=int, default=1)
    parser.add_argument("--alpha", type=float, default=0.6)

    def body():
        args = parser.parse_args(argv)
        quiet = quiet_stderr(verbosity(args.verbose) == 0)
        load = load_for_command(args.run_dir, "seq2seq")  # the path, checked before stdin
        texts = _texts(args)
        with quiet:
            task = load()
            try:
                outputs = task.translate(texts, beam_width=args.beam_width, alpha=args.alpha)
            except ValueError as e:  # e.g. an input longer than max_source_length
                raise UsageError(str(e)) from None
        for line in outputs:
            print(line)
        return 0

    return cli_boundary(body, argv)


def _texts(args):
    if args.beam_width < 1:
        raise UsageError(f"--beam-width must be >= 1, got {args.beam_width}")
    if not args.alpha >= 0:
        raise UsageError(f"--alpha must be >= 0, got {args.alpha}")
    texts = args.text or _stdin_lines()
    check_utf8(texts, "input")
    if not texts:
        raise UsageError("no input text (give TEXT arguments or lines on stdin)")
    empty = [i + 1 for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise UsageError(f"input {empty[0]} is empty: {texts[empty[0] - 1]!r}")
    return texts


if __name__ == "__main__":
    sys.exit(main())
