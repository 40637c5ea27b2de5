"""Tag sentences with a trained tagger: `python -m zoo.tag PATH "I saw a saw" [...]`.

PATH is a run directory (its model.keras) or a .tflite file exported from one; a .tflite
file needs its sidecar `<file>.json` ({"kind": "tagger", "words", "chars", "tags",
"max_chars", "max_len"}). Both paths encode tokens with the same `TokenEncoder`.
Prints one line per sentence: word/TAG pairs. Bad input: one line on stderr, exit 2.
`--verbose 0`: the tagged lines and errors only (no runtime log lines).
"""

import os
import sys

from zoo import litert
from zoo.cli import (
    OneLineParser,
    add_verbose_argument,
    check_utf8,
    cli_boundary,
    import_keras_quietly,
    quiet_stderr,
    read_sidecar,
    verbosity,
)
from zoo.cli import UsageError as _Usage
from zoo.rundir import run_kind


def load_keras_tagger(run_dir):
    path = os.path.join(run_dir, "model.keras")
    if not os.path.isfile(path):
        raise _Usage(f"no model.keras in run directory: {run_dir}")
    kind = run_kind(run_dir)
    if kind not in (None, "tagger"):
        raise _Usage(f"{run_dir} is a {kind!r} run, not a tagger")
    import_keras_quietly()
    from zoo import model_file
    from zoo.tagger.model import Tagger

    try:
        model = model_file.load(path, Tagger)
    except model_file.ModelFileError as e:
        raise _Usage(str(e)) from None
    return model.tag


class TFLiteTagger:
    """Runs an exported tagger .tflite (ids in, probabilities / tag ids out) on tokens."""

    def __init__(self, path):
        from zoo.tagger.encoding import TokenEncoder

        meta = read_sidecar(path, "tagger")
        try:
            self.tags = meta["tags"]
            self.max_len = int(meta["max_len"])
            self.encoder = TokenEncoder(meta["words"], meta["chars"], int(meta["max_chars"]))
        except (KeyError, TypeError, ValueError) as e:
            raise _Usage(f"bad sidecar file {path}.json: {type(e).__name__}: {e}") from None
        self.interpreter = litert.interpreter(path)
        signatures = self.interpreter.get_signature_list()
        key = next(iter(signatures))
        self.runner = self.interpreter.get_signature_runner(key)
        details = self.runner.get_input_details()
        shape = details["word_ids"]["shape_signature"]
        self.static_length = int(shape[1]) if shape[1] > 0 else None
        self.static_batch = shape[0] > 0

    def __call__(self, token_lists):
        import numpy as np

        from zoo.tagger.model import pad_tokens

        results = []
        for tokens in token_lists:  # one at a time: exported models may have batch 1
            if len(tokens) > (self.static_length or self.max_len):
                raise _Usage(
                    f"sentence has {len(tokens)} tokens, more than the model's "
                    f"{self.static_length or self.max_len}"
                )
            width = self.static_length or max(len(tokens), 1)
            padded = pad_tokens([list(tokens) + [""] * (width - len(tokens))])
            ids = {k: v.numpy().astype(np.int32) for k, v in self.encoder.encode(padded).items()}
            out = self.runner(**ids)
            if "tag_ids" in out:
                tag_ids = out["tag_ids"][0]
            else:
                tag_ids = np.argmax(out["probabilities"][0], axis=-1)
            results.append([(t, self.tags[int(i)]) for t, i in zip(tokens, tag_ids)])
        return results


def main(argv=None):
    import os as _os

    _os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = OneLineParser(prog="python -m zoo.tag", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="run directory (model.keras) or exported .tflite file")
    parser.add_argument("sentences", nargs="+", help="sentences (split on whitespace)")
    add_verbose_argument(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")

    def body():
        args = parser.parse_args(argv)
        quiet = verbosity(args.verbose) == 0
        if not os.path.exists(args.path):
            raise _Usage(f"no such run directory or .tflite file: {args.path}")
        check_utf8(args.sentences, "sentence")
        token_lists = [s.split() for s in args.sentences]
        empty = [i for i, tokens in enumerate(token_lists, 1) if not tokens]
        if empty:
            raise _Usage(f"sentence {empty[0]} is empty: {args.sentences[empty[0] - 1]!r}")
        if not os.path.isdir(args.path) and not args.path.endswith(".tflite"):
            raise _Usage(f"expected a run directory or a .tflite file: {args.path}")
        with quiet_stderr(quiet):
            tagger = (
                load_keras_tagger(args.path)
                if os.path.isdir(args.path)
                else TFLiteTagger(args.path)
            )
            try:
                tagged = tagger(token_lists)
            except (
                ValueError
            ) as e:  # Tagger.tag: a sentence longer than max_len (documented: error)
                raise _Usage(str(e)) from None
        for pairs in tagged:
            print(" ".join(f"{word}/{tag}" for word, tag in pairs))
        return 0

    return cli_boundary(body, argv)


if __name__ == "__main__":
    sys.exit(main())
