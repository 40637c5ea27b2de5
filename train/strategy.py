"""The distribution flags shared by every `python -m train` command, and the strategy they pick.

`--strategy auto|default|mirrored|multi_worker|tpu`:
  default       one device (`tf.distribute.get_strategy()`).
  mirrored      all local GPUs (or the logical CPUs a test configured) in one process.
  multi_worker  `MultiWorkerMirroredStrategy`, cluster from the standard `TF_CONFIG`.
  tpu           `TPUStrategy` on the TPU VM's local TPU (or `--tpu NAME`).
  auto          multi_worker when `TF_CONFIG` names several workers, mirrored when
                several GPUs are visible, else default.
`--mixed-precision`: `mixed_float16` on GPU (the engine scales the loss), `mixed_bfloat16`
on CPU and TPU. `--jit-compile/--no-jit-compile`: XLA for the forward and backward pass
(default: on for GPU and TPU, off on CPU, where it measured slower; docs/distributed.md).
`--checkpoint-every N`: also checkpoint every N training steps (0 = epoch ends only).

Collective ops (multi_worker) and TPUs must be set up before TensorFlow runs anything, so
`configure` creates those strategies right after the flags are parsed; the others are
created on first use, keeping bad-input errors fast (no TensorFlow import).
"""

import json
import os
import shutil
import tempfile

from zoo.cli import UsageError

STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu")

_state = {
    "name": "default",
    "strategy": None,
    "mixed_precision": False,
    "jit_compile": None,
    "checkpoint_every": 0,
    "scratch": None,
}


def add_arguments(parser):
    g = parser.add_argument_group("distribution and speed (docs/distributed.md)")
    g.add_argument(
        "--strategy",
        default="auto",
        help="auto (default), default, mirrored, multi_worker (reads TF_CONFIG) or tpu",
    )
    g.add_argument(
        "--tpu", default=None, help="TPU name or address for --strategy tpu (default: local)"
    )
    g.add_argument(
        "--mixed-precision",
        action="store_true",
        help="mixed_float16 on GPU (loss scaling), mixed_bfloat16 on CPU/TPU",
    )
    g.add_argument(
        "--jit-compile",
        dest="jit_compile",
        action="store_true",
        default=None,
        help="XLA-compile training steps (default: on for GPU/TPU, off on CPU)",
    )
    g.add_argument("--no-jit-compile", dest="jit_compile", action="store_false")
    g.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="checkpoint every N training steps as well as at epoch ends (default 0: epoch ends)",
    )


def _tf_config():
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        int(task["index"])
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"TF_CONFIG is not valid cluster JSON: {raw[:200]!r}") from None
    if not isinstance(workers, list) or not workers:
        raise UsageError(f"TF_CONFIG has no worker list: {raw[:200]!r}")
    return config


def _visible_gpus():
    # Without importing TensorFlow: CUDA_VISIBLE_DEVICES, else ask TF (it does not start a
    # device context to list physical devices).
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


# Commands whose training loop does not run under tf.distribute: one device only.
# (sagan's own loop, train/sagan/fit.py, runs on strategy.run like train/engine.py.)
SINGLE_DEVICE = {}


def configure(args, command=None):
    """Validates the flags, sets the dtype policy and creates early strategies. Idempotent."""
    name = getattr(args, "strategy", "default") or "default"
    if name not in STRATEGIES:
        raise UsageError(f"unknown --strategy {name!r}; choose from: {', '.join(STRATEGIES)}")
    if command in SINGLE_DEVICE:
        if name not in ("auto", "default"):
            raise UsageError(
                f"--strategy {name} is not supported by {command} yet: its loop "
                f"{SINGLE_DEVICE[command]} trains on one device; use --strategy default"
            )
        name = "default"
        if getattr(args, "mixed_precision", False) and device_kind() == "gpu":
            raise UsageError(
                f"--mixed-precision is not supported by {command} on GPU yet: its loop "
                f"{SINGLE_DEVICE[command]} does not scale the float16 loss"
            )
    every = getattr(args, "checkpoint_every", 0) or 0
    if every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {every}")
    config = _tf_config()
    if name == "multi_worker" and config is None:
        raise UsageError("--strategy multi_worker needs TF_CONFIG (see docs/distributed.md)")
    if name == "auto":
        if config is not None and len(config["cluster"]["worker"]) > 1:
            name = "multi_worker"
    _state.update(
        name=name,
        strategy=None,
        mixed_precision=bool(getattr(args, "mixed_precision", False)),
        jit_compile=getattr(args, "jit_compile", None),
        checkpoint_every=every,
        tpu=getattr(args, "tpu", None),
    )
    if name == "multi_worker" and hasattr(args, "out") and not args.out:
        raise UsageError(
            "--strategy multi_worker needs an explicit --out (the same on every worker)"
        )
    if name in ("multi_worker", "tpu"):
        get()
    if _state["mixed_precision"]:
        _set_policy()
    if name == "multi_worker" and not is_chief():
        _use_scratch_out(args)
    return _state


def _set_policy():
    import keras

    policy = "mixed_float16" if device_kind() == "gpu" else "mixed_bfloat16"
    keras.mixed_precision.set_global_policy(policy)
    _state["policy"] = policy


def device_kind():
    if _state["name"] == "tpu":
        return "tpu"
    return "gpu" if _visible_gpus() else "cpu"


def get():
    """The `tf.distribute.Strategy` the flags asked for (created once)."""
    if _state["strategy"] is not None:
        return _state["strategy"]
    import tensorflow as tf

    name = _state["name"]
    if name == "auto":
        name = "mirrored" if _visible_gpus() > 1 else "default"
    if name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        cpus = tf.config.list_logical_devices("CPU")
        devices = [d.name for d in (gpus or cpus)]
        strategy = tf.distribute.MirroredStrategy(devices)
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=_state.get("tpu") or "local"
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    _state["strategy"] = strategy
    _state["resolved"] = name
    return strategy


def scope():
    """`with strategy.scope()`: build and compile models inside it."""
    return get().scope()


def jit_compile():
    """--jit-compile if given, else on for GPU/TPU and off on CPU (measured slower there)."""
    if _state["jit_compile"] is not None:
        return bool(_state["jit_compile"])
    return device_kind() in ("gpu", "tpu")


def checkpoint_every():
    return _state["checkpoint_every"]


def mixed_precision():
    return _state["mixed_precision"]


def worker():
    """(task index, number of workers) of this process; (0, 1) outside multi_worker."""
    config = _tf_config() if _state["name"] == "multi_worker" else None
    if not config:
        return 0, 1
    task = config["task"]
    workers = config["cluster"]["worker"]
    if task.get("type", "worker") == "chief":
        return 0, len(workers) + 1
    offset = 1 if config["cluster"].get("chief") else 0
    return int(task["index"]) + offset, len(workers) + offset


def is_chief():
    """Only the chief writes the run directory and checkpoints (worker 0 without a chief)."""
    config = _tf_config() if _state["name"] == "multi_worker" else None
    if not config:
        return True
    task = config["task"]
    if config["cluster"].get("chief"):
        return task.get("type") == "chief"
    return task.get("type", "worker") == "worker" and int(task["index"]) == 0


def _use_scratch_out(args):
    """Non-chief workers run the same code but write into a private scratch copy of --out,
    deleted at exit: every worker executes the same collectives, one writes the run."""
    out = getattr(args, "out", None)
    if out is None:
        return
    index, _ = worker()
    scratch = tempfile.mkdtemp(prefix=f"zoo-worker{index}-")
    target = os.path.join(scratch, "run")
    if getattr(args, "resume", False) and os.path.isdir(out):
        shutil.copytree(out, target)
    _state["scratch"] = scratch
    args.out = target
    import atexit

    atexit.register(shutil.rmtree, scratch, True)


def reset():
    """Back to one device, float32, no step checkpoints (tests, and library use after a CLI run)."""
    _state.update(
        name="default",
        strategy=None,
        mixed_precision=False,
        jit_compile=None,
        checkpoint_every=0,
        scratch=None,
    )
    _state.pop("resolved", None)
    _state.pop("policy", None)


def describe():
    strategy = get()
    return {
        "strategy": _state.get("resolved", _state["name"]),
        "replicas": int(strategy.num_replicas_in_sync),
        "mixed_precision": _state.get("policy") if _state["mixed_precision"] else None,
        "jit_compile": jit_compile(),
    }
