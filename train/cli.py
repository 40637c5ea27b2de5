"""Command-line entry point shared by all training commands.

`python -m train MODEL ...` looks MODEL up in `COMMANDS`; each command module provides
`CONFIG` (its options dataclass, from which train.config makes the flags) and
`run(args, context) -> int`: `context` is the command's `train.strategy.RunContext`
(distribution flags, train.preemption signals), built here and passed down. Environment
variables are set here only. A new model plugs in by adding a line to `COMMANDS`
(`DEFAULTS` in its module: flag defaults of its own, as `universal_transformer`'s arch).

`--backend tensorflow|jax` (default: KERAS_BACKEND, else tensorflow) sets KERAS_BACKEND
before Keras is imported; it refuses when Keras is already imported with the other backend
in this process, or the backend's package is not installed.

Exit codes: zoo.cli's (0 success, 2 bad input, 1 unexpected failure; nothing already
written is lost), and 143 / 130 stopped by SIGTERM / SIGINT (a training loop first
finishes its step and writes a checkpoint: train.preemption).
"""

import importlib
import importlib.util
import os
import platform
import sys
import traceback

from zoo.cli import (
    EXIT_USAGE,
    OneLineParser,
    UsageError,
    runtime_logs,
    unexpected,
    verbose_flag,
)
from zoo.rundir import load_json

COMMANDS = {
    "tagger": ("train.tagger", "part-of-speech tagger (attention / fc / window / bilstm)"),
    "seq2seq": (
        "train.seq2seq",
        "sequence-to-sequence Transformer (--arch universal_transformer for UT)",
    ),
    "universal_transformer": (
        "train.seq2seq.universal",
        "Universal Transformer (seq2seq --arch universal_transformer)",
    ),
    "sagan": ("train.sagan", "Self-Attention GAN"),
}


# The run kinds whose config.json a command replays (--config), where not its own alone.
REPLAYS = {
    "seq2seq": ("seq2seq", "universal_transformer"),
    "universal_transformer": ("universal_transformer", "seq2seq"),
}


def read_config(path, command):
    """The config.json that `--config PATH` names (a run directory names its own), checked
    to be a run that `command` can replay. Its options ("train", train.config's `record`)
    become flags (`config_argv`) that go through the same parsing and checks as typed
    ones, and flags after --config override them; paths are used as recorded (relative to
    the directory the run started from); out, resume and compare are never recorded."""
    if not path:
        raise UsageError("--config needs a FILE (a run's config.json)")
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise UsageError(f"--config: file not found: {path}")
    config = load_json(path, "--config file ")
    if not isinstance(config, dict):
        raise UsageError(f"--config: {path} does not hold a JSON object")
    kind = config.get("kind")
    if kind not in REPLAYS.get(command, (command,)):
        raise UsageError(f"--config: {path} is a {kind!r} run, not {command!r}")
    return config


def config_argv(config):
    """The flags of config["kind"]'s command that reproduce a run's recorded options."""
    from train import config as configs

    module = importlib.import_module(COMMANDS[config["kind"]][0])
    return configs.replay_argv(module.CONFIG, config.get("train") or {})


def _usage():
    lines = ["usage: python -m train MODEL [options]   (python -m train MODEL --help)", "models:"]
    lines += [f"  {name:24s}{help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


BACKENDS = ("tensorflow", "jax")
_EXTRAS = {"tensorflow": "pip install tensorflow", "jax": "pip install '.[jax]'"}


def _split_flag(argv, flag):
    """(the value of the last `FLAG VALUE` or `FLAG=VALUE`, "" for a FLAG with nothing
    after it, None without one; argv without them)."""
    value, rest = None, []
    items = iter(argv)
    for item in items:
        if item == flag:
            value = next(items, "")
        elif item.startswith(flag + "="):
            value = item.split("=", 1)[1]
        else:
            rest.append(item)
    return value, rest


def select_backend(argv):
    """Sets KERAS_BACKEND from --backend (or checks the one the environment names) before
    anything imports Keras, whose backend is fixed at import."""
    asked, _ = _split_flag(argv, "--backend")
    name = asked if asked is not None else os.environ.get("KERAS_BACKEND") or "tensorflow"
    where = "--backend" if asked is not None else "KERAS_BACKEND"
    if name not in BACKENDS:
        raise UsageError(f"unknown {where} {name!r}; choose from: {', '.join(BACKENDS)}")
    keras = sys.modules.get("keras")
    current = keras.backend.backend() if keras is not None and hasattr(keras, "backend") else None
    if current is not None and current != name:
        raise UsageError(
            f"{where} {name}: Keras is already imported with the {current} backend in this "
            f"process (the backend is fixed at import); run the command in a new process"
        )
    if current is None and importlib.util.find_spec(name) is None:
        raise UsageError(f"{where} {name}: {name} is not installed ({_EXTRAS[name]})")
    os.environ["KERAS_BACKEND"] = name


# The commands whose steps are convolutions, run faster by oneDNN (prefer_onednn).
ONEDNN_COMMANDS = ("sagan",)


def prefer_onednn():
    """Turns TensorFlow's oneDNN kernels on for x86 CPUs unless TF_ENABLE_ONEDNN_OPTS says
    otherwise (TensorFlow does only on CPUs with AVX-512 VNNI / BF16, AVX-VNNI or AMX; why
    only ONEDNN_COMMANDS: benchmarks/results.md, "oneDNN"). TensorFlow reads the variable
    once; after it is imported, setting it would only leak into child processes."""
    if "tensorflow" in sys.modules:
        return
    if platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def _fail(message, code):
    print(f"error: {message}", file=sys.stderr)
    return code


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)  # bare: a usage error
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        return _fail(f"unknown model {name!r}; choose from: {', '.join(COMMANDS)}", EXIT_USAGE)
    debug = "--debug" in rest
    from train import preemption
    from zoo import run_lock

    try:
        with preemption.handlers() as signals, runtime_logs(verbose_flag(rest)):
            return _run(name, rest, signals)
    except preemption.Stopped as e:
        print(str(e), file=sys.stderr)
        return e.code
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as e:  # noqa: BLE001  (the CLI boundary: report, do not crash)
        if debug:
            traceback.print_exc()
        return unexpected(e, hint=not debug)
    finally:
        run_lock.release_all()


def build_parser(name):
    """The parser of `python -m train NAME` (tests parse through it too)."""
    from train import config, strategy

    module = importlib.import_module(COMMANDS[name][0])
    parser = OneLineParser(prog=f"python -m train {name}", description=COMMANDS[name][1])
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="Keras backend (default: KERAS_BACKEND, else tensorflow); jax trains with a "
        "jitted stateless step",
    )
    config.add_arguments(parser, module.CONFIG)
    parser.set_defaults(**getattr(module, "DEFAULTS", {}))
    strategy.add_arguments(parser)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="replay the settings of a run's config.json (later flags override)",
    )
    return parser


def _run(name, rest, signals):
    select_backend(rest)
    if name in ONEDNN_COMMANDS:
        prefer_onednn()
    module = importlib.import_module(COMMANDS[name][0])
    parser = build_parser(name)
    from train import strategy

    config_path, rest = _split_flag(rest, "--config")
    if config_path is not None:
        rest = config_argv(read_config(config_path, name)) + rest
    args = parser.parse_args(rest)
    # --device cpu: the GPUs hidden as the backend starts (once started: train.strategy).
    jax = os.environ["KERAS_BACKEND"] == "jax"
    if args.device == "cpu" and ("jax" if jax else "tensorflow") not in sys.modules:
        os.environ["JAX_PLATFORMS" if jax else "CUDA_VISIBLE_DEVICES"] = "cpu" if jax else "-1"
    with strategy.configure(args, signals) as context:
        return int(module.run(args, context) or 0)
