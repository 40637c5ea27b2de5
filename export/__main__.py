"""python -m export {savedmodel,tflite,check,verify,bench} ...

Every command takes `--verbose auto/0/1/2` (the train commands' flag): 0 prints
the results only (check's verdict, verify's and bench's reports; nothing for
savedmodel and tflite, whose result is the files) and errors, with the
TensorFlow / LiteRT runtime's own log lines muted; auto (the default), 1 and 2
also print what was written.

Exit codes: 0 success; 1 export failed, model incompatible (check), a model
that fails on the GPU accelerator (verify --accelerator gpu) or an unexpected
error (traceback only with --debug); 2 bad input (one line); 3 verify
--accelerator gpu without a Vulkan device (after the static check's verdict).
"""

import argparse
import os
import sys

from zoo.cli import OneLineParser, UsageError, import_keras_quietly, quiet_stderr


def _number(text, ok, rule, cast=float):
    try:
        value = cast(text)
    except ValueError:
        what = "an integer" if cast is int else "a number"
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
    if not ok(value):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be {rule}, got {value:g}")
    return value


def _positive_int(text):
    return _number(text, lambda v: v >= 1, ">= 1", int)


def _fraction(text):
    return _number(text, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")


def _non_negative(text):
    return _number(text, lambda v: v >= 0.0, ">= 0")


def build_parser():
    from export.check import TARGETS
    from export.tflite import QUANTIZE

    p = OneLineParser(prog="python -m export", description="Export zoo models with proof.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    s = sub.add_parser("savedmodel", help="TF Serving SavedModel: BASE/NAME/<version>/")
    s.add_argument("source", metavar="RUN_DIR_OR_MODEL")
    s.add_argument("--out", required=True, metavar="BASE/NAME")
    s.add_argument("--version", type=_positive_int)

    t = sub.add_parser("tflite", help="builtin-ops-only .tflite, checked against Keras")
    t.add_argument("source", metavar="RUN_DIR_OR_MODEL")
    t.add_argument("--out", required=True, metavar="FILE.tflite")
    t.add_argument("--quantize", default="none", choices=QUANTIZE)
    t.add_argument("--static-shape", action="store_true", help="batch 1, fixed length (GPU/NPU)")
    t.add_argument("--length", type=_positive_int, help="fixed length for --static-shape")
    t.add_argument("--tolerance", type=_non_negative, help="max abs diff allowed vs Keras")
    t.add_argument("--min-agreement", type=_fraction, help="min argmax agreement vs Keras (0 to 1)")

    c = sub.add_parser("check", help="delegate compatibility of a .tflite")
    c.add_argument("file", metavar="FILE.tflite")
    c.add_argument("--target", default="gpu", choices=TARGETS)

    v = sub.add_parser(
        "verify",
        help="Keras vs SavedModel (clean process) vs LiteRT; "
        "--accelerator gpu: LiteRT's real GPU accelerator vs its CPU",
    )
    v.add_argument("run_dir", metavar="RUN_DIR_OR_FILE")
    v.add_argument(
        "--accelerator",
        choices=("gpu",),
        help="run FILE.tflite (or --tflite) on this accelerator and compare with CPU",
    )
    v.add_argument(
        "--runs", type=_positive_int, default=20, help="timed runs per signature (--accelerator)"
    )
    v.add_argument("--savedmodel", metavar="DIR")
    v.add_argument("--tflite", metavar="FILE")
    v.add_argument("--samples", type=_positive_int, default=64)
    v.add_argument("--json", action="store_true", help="print the report as JSON")

    b = sub.add_parser("bench", help="latency at batch 1 and 32, LiteRT vs Keras; size")
    b.add_argument("target", metavar="FILE.tflite|SAVEDMODEL")
    b.add_argument(
        "--run", metavar="RUN_DIR", help="Keras model to compare (default: sidecar's source)"
    )
    b.add_argument("--threads", type=_positive_int)
    b.add_argument("--runs", type=_positive_int, default=50)
    b.add_argument("--json", action="store_true")
    for command in (s, t, c, v, b):
        # after the command name too; the top-level --debug's help says what it does
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        command.add_argument(
            "--verbose",
            default="auto",
            help="auto (default, as 1), 0 (results and errors only), 1, 2",
        )
    return p


def _run(args):
    import json

    if args.command == "savedmodel":
        from export.savedmodel import export_savedmodel

        path = export_savedmodel(args.source, args.out, version=args.version)
        if args.verbose:
            print(f"wrote {path} (signatures: {os.path.join(path, 'signature.json')})")
        return 0
    if args.command == "tflite":
        from export.tflite import export_tflite

        r = export_tflite(
            args.source,
            args.out,
            quantize=args.quantize,
            static_shape=args.static_shape,
            length=args.length,
            tolerance=args.tolerance,
            min_agreement=args.min_agreement,
        )
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in r.report["max_abs_diff"].items())
        agree = (
            ""
            if r.report["agreement"] is None
            else f", argmax agreement {r.report['agreement']:.2%}"
        )
        if args.verbose:
            print(
                f"wrote {r.path} ({r.size_bytes / 1e6:.3f} MB) and {r.sidecar}; "
                f"LiteRT vs Keras on {r.report['samples']} samples: max abs diff {diffs}{agree}"
            )
        return 0
    if args.command == "check":
        from export.check import check_file

        problems = check_file(args.file, args.target)
        for p in problems:
            print(p)
        if problems:
            print(
                f"{args.file}: NOT compatible with --target {args.target} ({len(problems)} problems)"
            )
            return 1
        print(f"{args.file}: compatible with --target {args.target}")
        return 0
    from export import bench, verify

    if args.command == "verify" and args.accelerator:
        if args.savedmodel:
            raise UsageError("--accelerator runs a .tflite file; --savedmodel does not apply")
        report = verify.verify_accelerator(
            args.run_dir, tflite=args.tflite, samples=args.samples, runs=args.runs
        )
        text = verify.format_accelerator_report
        code = 3 if "no_device" in report else 0 if report["ok"] else 1
    elif args.command == "verify":
        report = verify.verify(
            args.run_dir, savedmodel=args.savedmodel, tflite=args.tflite, samples=args.samples
        )
        text, code = verify.format_report, 0 if report["ok"] else 1
    else:
        report = bench.bench(args.target, run_dir=args.run, threads=args.threads, runs=args.runs)
        text, code = bench.format_report, 0
    print(json.dumps(report, indent=2) if args.json else text(report))
    return code


def main(argv=None):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from export.errors import ExportError
    from zoo.cli import cli_boundary, verbosity

    def body():
        args = build_parser().parse_args(argv)
        args.verbose = verbosity(args.verbose)  # the train and zoo commands' check and message
        try:
            if args.command != "check":  # check reads the flatbuffer itself
                # TensorFlow/Keras and LiteRT first, so a bad input found later still
                # gets its one line after their start-up lines (which runtime_logs filters).
                import_keras_quietly()
                import ai_edge_litert.interpreter  # noqa: F401
            with quiet_stderr(args.verbose == 0):
                return _run(args)
        except ExportError as e:
            if args.debug:
                raise
            print(f"export failed: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    try:  # the error contract of every command (zoo.cli.cli_boundary)
        return cli_boundary(body, argv)
    except SystemExit as e:  # --help
        return e.code


if __name__ == "__main__":
    sys.exit(main())
