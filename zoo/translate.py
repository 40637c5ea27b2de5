"""`python -m zoo.translate RUN_DIR "text" ["text" ...]`: translate with a trained run.

Reads RUN_DIR/model.keras (the SentencePiece tokenizer is inside the model),
prints one output line per input. With no text arguments, translates stdin line
by line. `--beam-width N` uses beam search (length penalty `--alpha`).
Exit codes: 0 ok, 2 bad input (one line on stderr), 1 unexpected error.
"""

import argparse
import os
import sys


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def main(argv=None):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = _Parser(prog="python -m zoo.translate", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="run directory (or a .keras file) of a seq2seq run")
    parser.add_argument("text", nargs="*", help="input text (default: lines of stdin)")
    parser.add_argument("--beam-width", type=int, default=1)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    path = args.run_dir
    if os.path.isdir(path):
        path = os.path.join(path, "model.keras")
    if not os.path.isfile(path):
        print(f"error: no model found: {path}", file=sys.stderr)
        return 2
    if args.beam_width < 1:
        print(f"error: --beam-width must be >= 1, got {args.beam_width}", file=sys.stderr)
        return 2
    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    empty = [i + 1 for i, t in enumerate(texts) if not t.strip()]
    if empty:
        print(f"error: input {empty[0]} is empty", file=sys.stderr)
        return 2
    try:
        import keras

        import zoo  # noqa: F401  (registers the model classes)
        from zoo.seq2seq import Seq2SeqTransformer

        model = keras.models.load_model(path, compile=False)
        if not isinstance(model, Seq2SeqTransformer):
            print(f"error: {path} holds a {type(model).__name__}, not a seq2seq model", file=sys.stderr)
            return 2
        try:
            outputs = model.translate(texts, beam_width=args.beam_width, alpha=args.alpha)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    except Exception as e:  # noqa: BLE001  (CLI boundary)
        if args.debug:
            raise
        print(f"error: unexpected {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        return 1
    for line in outputs:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
