"""Tag sentences with a trained tagger: `python -m zoo.tag PATH "I saw a saw" [...]`.

PATH is a run directory (its model.keras, run with Keras), or a .tflite file
exported from one or its export folder (run with `zoo.lite`: LiteRT and NumPy,
no TensorFlow); a .tflite file needs its sidecar `<file>.json` ({"kind":
"tagger", "words", "chars", "tags", "max_chars", "max_len"}). Both apply the
same token rules (`zoo.tagger.encoding.TokenEncoder`'s, written in NumPy by
`zoo.lite`). Prints one line per sentence: word/TAG pairs. Bad input: one line
on stderr, exit 2. `--verbose 0`: the tagged lines and errors only.
"""

import os
import sys

from zoo.cli import UsageError as _Usage
from zoo.cli import (
    check_utf8,
    cli_boundary,
    command_parser,
    quiet_stderr,
    verbosity,
)
from zoo.tasks import load_for_command


def main(argv=None):
    parser = command_parser("zoo.tag", __doc__)
    parser.add_argument("path", help="run directory (model.keras), .tflite file or export folder")
    parser.add_argument("sentences", nargs="+", help="sentences (split on whitespace)")

    def body():
        args = parser.parse_args(argv)
        quiet = quiet_stderr(verbosity(args.verbose) == 0)
        if not os.path.exists(args.path):
            raise _Usage(f"no such run directory or .tflite file: {args.path}")
        check_utf8(args.sentences, "sentence")
        token_lists = [s.split() for s in args.sentences]
        empty = [i for i, tokens in enumerate(token_lists, 1) if not tokens]
        if empty:
            raise _Usage(f"sentence {empty[0]} is empty: {args.sentences[empty[0] - 1]!r}")
        if not os.path.isdir(args.path) and not args.path.endswith(".tflite"):
            raise _Usage(f"expected a run directory or a .tflite file: {args.path}")
        with quiet:
            tagger = load_for_command(args.path, "tagger")()
            try:
                tagged = tagger._tag_tokens(token_lists)
            except ValueError as e:  # a sentence longer than the model's length
                raise _Usage(str(e)) from None
        for pairs in tagged:
            print(" ".join(f"{word}/{tag}" for word, tag in pairs))
        return 0

    return cli_boundary(body, argv)


if __name__ == "__main__":
    sys.exit(main())
