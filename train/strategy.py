"""The distribution flags shared by every `python -m train` command, and the strategy they pick.

`--strategy`, `--tpu`, `--mixed-precision`, `--jit-compile` and `--checkpoint-every` are
docs/distributed.md's table. Under Keras's JAX backend (`--backend jax`, train.cli) the
same flags pick `keras.distribution.DataParallel` over the local devices (mirrored, tpu;
auto when there are several GPUs/TPUs) or one device (default); multi_worker is
tf.distribute's only. `--device auto|cpu|gpu`: cpu hides the GPUs; gpu refuses (exit 2)
when the backend sees none, instead of training on the CPU.

`configure` turns the flags into the command's `RunContext`, which train.cli passes down
to the command, its steps and its training loop (no module state here).

Collective ops (multi_worker) and TPUs must be set up before TensorFlow runs anything, so
`configure` creates those strategies right after the flags are parsed; the others are
created on first use, keeping bad-input errors fast (no TensorFlow import).
"""

import argparse
import atexit
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile

from train import preemption
from zoo.cli import UsageError

STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "tpu")
DEVICES = ("auto", "cpu", "gpu")
POLICIES = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
# The bare --mixed-precision: mixed_float16 on GPU (loss scaling), else mixed_bfloat16.
_BARE = "on"


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
        "--device",
        default="auto",
        help="auto (default), cpu, or gpu (refused when no GPU is visible to the backend)",
    )
    g.add_argument(
        "--mixed-precision",
        nargs="?",
        const=_BARE,
        default="auto",
        metavar="POLICY",
        help="default auto: mixed_bfloat16 on bfloat16 GPUs (compute capability 8+) and TPUs, "
        "float32 on CPU; the bare flag: mixed_float16 on GPU (loss scaling), mixed_bfloat16 "
        "on CPU/TPU; or float32, mixed_bfloat16, mixed_float16",
    )
    g.add_argument(
        "--no-mixed-precision",
        dest="mixed_precision",
        action="store_const",
        const="float32",
        help="the same as --mixed-precision float32",
    )
    g.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        help="XLA-compile training steps (default: on for GPU/TPU, off on CPU)",
    )
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


def backend():
    """Keras's backend: the imported one, else the one KERAS_BACKEND will give."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "backend"):
        return keras.backend.backend()
    return os.environ.get("KERAS_BACKEND") or "tensorflow"


def _gpus():
    """[(name, (major, minor) or None)] of the visible GPUs (physical devices: no device
    context is started)."""
    out = []
    if backend() == "jax":
        import jax

        try:
            devices = jax.devices("gpu")
        except RuntimeError:  # no backend of that kind (e.g. jax without CUDA)
            devices = []
        for d in devices:
            cc = getattr(d, "compute_capability", None)
            out.append(
                (d.device_kind, tuple(int(p) for p in str(cc).split(".")[:2]) if cc else None)
            )
        return out
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        out.append((details.get("device_name", gpu.name), details.get("compute_capability")))
    return out


def _restrict_device(device):
    """--device: cpu hides the GPUs from a backend already imported (before, train.cli
    sets the environment); gpu refuses without one."""
    if device not in DEVICES:
        raise UsageError(f"unknown --device {device!r}; choose from: {', '.join(DEVICES)}")
    if device == "cpu":
        if backend() == "jax" and "jax" in sys.modules:
            import jax

            jax.config.update("jax_platforms", "cpu")
        elif backend() != "jax" and "tensorflow" in sys.modules:
            import tensorflow as tf

            tf.config.set_visible_devices([], "GPU")
    elif device == "gpu" and not _gpus():
        extra = "jax-gpu" if backend() == "jax" else "gpu"
        raise UsageError(
            f"--device gpu: {backend()} sees no GPU (no NVIDIA driver, or the CUDA libraries "
            f"are not installed: pip install '.[{extra}]'); use --device cpu to train on the CPU"
        )


def configure(args, signals=None):
    """The `RunContext` of the flags in `args`, validated; sets the dtype policy and
    creates the early strategies. `signals`: the command's (train.preemption.handlers).
    Every command takes every flag."""
    name = getattr(args, "strategy", "default") or "default"
    if name not in STRATEGIES:
        raise UsageError(f"unknown --strategy {name!r}; choose from: {', '.join(STRATEGIES)}")
    policy = getattr(args, "mixed_precision", "auto")
    policy = {True: _BARE, False: "auto", None: "auto"}.get(policy, policy)
    if policy not in POLICIES + (_BARE,):
        raise UsageError(
            f"unknown --mixed-precision {policy!r}; choose from: {', '.join(POLICIES)}"
        )
    if backend() == "jax" and name == "multi_worker":
        raise UsageError(
            "--strategy multi_worker is tf.distribute's; under JAX use --strategy mirrored "
            "(keras.distribution.DataParallel over this machine's devices)"
        )
    device = getattr(args, "device", "auto") or "auto"
    every = getattr(args, "checkpoint_every", 0) or 0
    if every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {every}")
    config = _tf_config()
    if name == "multi_worker" and config is None:
        raise UsageError("--strategy multi_worker needs TF_CONFIG (see docs/distributed.md)")
    if name == "auto" and config is not None and len(config["cluster"]["worker"]) > 1:
        name = "multi_worker"
    _restrict_device(device)
    jit = getattr(args, "jit_compile", None)
    context = RunContext(name, policy, jit, every, getattr(args, "tpu", None), signals)
    context.announced = False
    if name == "multi_worker" and hasattr(args, "out") and not args.out:
        raise UsageError(
            "--strategy multi_worker needs an explicit --out (the same on every worker)"
        )
    if name in ("multi_worker", "tpu") and backend() != "jax":
        context.strategy  # noqa: B018  (created now: before TensorFlow runs anything)
    if policy not in ("auto", "float32"):
        context.policy  # noqa: B018  ("auto" waits for the model's scope: it asks the device)
    if name == "multi_worker" and not context.is_chief():
        _use_scratch_out(args, context.worker()[0])
    return context


class RunContext:
    """One command's run: the distribution flags `configure` checked, the strategy they
    pick (created on first use), the dtype policy, and the command's `signals`
    (train.preemption.Signals). `RunContext()` is one device, the device's policy, no
    step checkpoints, nothing to announce, no signal handlers: what library use (tests,
    benchmarks) gets when no command built one. As a context manager, it takes back on
    exit the global `keras.distribution` its strategy set (JAX, several devices) and the
    global dtype policy its `policy` set."""

    def __init__(
        self, name="default", mixed_precision="auto", jit=None, every=0, tpu=None, signals=None
    ):
        self.name, self.mixed_precision, self.jit, self.tpu = name, mixed_precision, jit, tpu
        self.checkpoint_every = every
        self.signals = signals or preemption.Signals()
        self.announced = True  # configure: False, announced once by the training loop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if getattr(self.__dict__.get("strategy"), "distribution", None) is not None:
            import keras

            keras.distribution.set_distribution(None)
        if self.__dict__.get("_policy_before") is not None:
            import keras

            keras.mixed_precision.set_global_policy(self.__dict__.pop("_policy_before"))

    @functools.cached_property
    def policy(self):
        """The dtype policy --mixed-precision resolves to on this device (set once)."""
        import keras

        asked = self.mixed_precision
        kind = self.device_kind() if asked in (_BARE, "auto") else None
        if asked == _BARE:
            policy = "mixed_float16" if kind == "gpu" else "mixed_bfloat16"
        elif asked == "auto":  # bfloat16 on TPUs, and on GPUs all of compute capability 8+
            capabilities = [cc for _, cc in _gpus()] if kind == "gpu" else []
            bfloat16 = bool(capabilities) and all(
                cc is not None and tuple(cc) >= (8, 0) for cc in capabilities
            )
            policy = "mixed_bfloat16" if kind == "tpu" or bfloat16 else None
        else:
            policy = None if asked == "float32" else asked
        if policy == "mixed_bfloat16" and cpu_bfloat16() is False and self.device_kind() == "cpu":
            print(
                "mixed_bfloat16 on a CPU without bfloat16 instructions (no avx512_bf16 or "
                "amx_bf16 in /proc/cpuinfo): a step costs 1.1-1.8x float32's "
                "(benchmarks/translation.md); --mixed-precision float32 trains faster",
                file=sys.stderr,
                flush=True,
            )
        if policy:
            self._policy_before = keras.mixed_precision.global_policy()
            keras.mixed_precision.set_global_policy(policy)
        return policy

    def device_kind(self):
        if self.name == "tpu":
            return "tpu"
        if backend() == "jax":
            import jax

            platform = jax.default_backend()
            return platform if platform in ("gpu", "tpu") else "cpu"
        return "gpu" if _gpus() else "cpu"

    @functools.cached_property
    def strategy(self):
        """The `tf.distribute.Strategy` the flags asked for (created once, after the dtype
        policy is set; `resolved` names it); under JAX, a stand-in holding the
        `keras.distribution` it set."""
        self.policy  # noqa: B018
        jax = backend() == "jax"
        self.resolved, strategy = (
            _jax_strategy(self.name) if jax else _tf_strategy(self.name, self.tpu)
        )
        return strategy

    def scope(self):
        """`with context.scope()`: build and compile models inside it."""
        return self.strategy.scope()

    @property
    def jit_compile(self):
        """--jit-compile if given, else on for GPU/TPU and off on CPU (measured slower
        there); under JAX always on (an un-jitted JAX step runs op by op)."""
        if self.jit is not None:
            return bool(self.jit)
        if backend() == "jax":
            return True
        return self.device_kind() in ("gpu", "tpu")

    def worker(self):
        """(task index, number of workers) of this process; (0, 1) outside multi_worker."""
        config = _tf_config() if self.name == "multi_worker" else None
        if not config:
            return 0, 1
        task = config["task"]
        workers = config["cluster"]["worker"]
        if task.get("type", "worker") == "chief":
            return 0, len(workers) + 1
        offset = 1 if config["cluster"].get("chief") else 0
        return int(task["index"]) + offset, len(workers) + offset

    def is_chief(self):
        """Only the chief writes the run directory and checkpoints (worker 0 without one)."""
        return self.worker()[0] == 0

    def runtime(self):
        """Where the run trains: backend, devices, strategy, dtype policy, XLA (recorded
        in config.json and metrics.json as "runtime")."""
        replicas = int(self.strategy.num_replicas_in_sync)
        kind = self.device_kind()
        if kind == "gpu":
            names = sorted({name for name, _ in _gpus()}) or ["gpu"]
            device = " / ".join(names)
        else:
            device = kind
        import keras

        return {
            "backend": backend(),
            "devices": replicas,
            "device": device,
            "strategy": self.resolved,
            "dtype_policy": keras.mixed_precision.global_policy().name,
            "jit_compile": self.jit_compile,
            "onednn": onednn(),
        }

    def announce(self, info=None):
        """Prints `describe_runtime(info)` on stderr, once per configured command (the
        training loops call it as they start; a `RunContext()` prints nothing)."""
        if self.announced:
            return
        self.announced = True
        print(describe_runtime(info or self.runtime()), file=sys.stderr, flush=True)


def _jax_strategy(name):
    """(resolved name, stand-in strategy): `keras.distribution.DataParallel` over the
    local devices when the flags ask for several (set globally, so models built
    afterwards are replicated), else one device."""
    import jax
    import keras

    devices = jax.devices()
    several = len(devices) > 1
    if name == "auto":
        name = "mirrored" if several and devices[0].platform in ("gpu", "tpu") else "default"
    if name in ("mirrored", "tpu") and several:
        distribution = keras.distribution.DataParallel(devices=devices)
        keras.distribution.set_distribution(distribution)
        return name, JaxStrategy(distribution, len(devices))
    return "default", JaxStrategy(None, 1)


class JaxStrategy:
    """What the run code asks of a strategy, under JAX: replicas and a scope."""

    def __init__(self, distribution, replicas):
        self.distribution = distribution
        self.num_replicas_in_sync = replicas

    def scope(self):
        if self.distribution is None:
            return contextlib.nullcontext()
        return self.distribution.scope()


def _tf_strategy(name, tpu=None):
    """(resolved name, the `tf.distribute.Strategy`)."""
    import tensorflow as tf

    if name == "auto":
        name = "mirrored" if len(_gpus()) > 1 else "default"
    if name == "default":
        return name, tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        cpus = tf.config.list_logical_devices("CPU")
        return name, tf.distribute.MirroredStrategy([d.name for d in (gpus or cpus)])
    if name == "multi_worker":
        return name, tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return name, tf.distribute.TPUStrategy(resolver)


def _use_scratch_out(args, index):
    """Non-chief workers run the same code but write into a private scratch copy of --out,
    deleted at exit: every worker executes the same collectives, one writes the run."""
    out = getattr(args, "out", None)
    if out is None:
        return
    scratch = tempfile.mkdtemp(prefix=f"zoo-worker{index}-")
    target = os.path.join(scratch, "run")
    if getattr(args, "resume", False) and os.path.isdir(out):
        shutil.copytree(out, target)
    args.out = target
    atexit.register(shutil.rmtree, scratch, True)


def cpu_bfloat16(cpuinfo="/proc/cpuinfo"):
    """Whether the CPU has bfloat16 instructions (avx512_bf16 or amx_bf16 among the x86
    flags of `cpuinfo`); None where the file or its flags cannot be read."""
    try:
        with open(cpuinfo) as f:
            flags = next((line for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:
        return None
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split(":", 1)[-1].split()))


def onednn():
    """Whether TensorFlow runs its oneDNN kernels on the CPU (train.cli.prefer_onednn); None
    under JAX, or when this TensorFlow cannot say."""
    if backend() != "tensorflow":
        return None
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def describe_runtime(info):
    """The line every command prints at start, of `RunContext.runtime()`: `backend jax, 1 x
    cpu, float32, XLA on` (on a CPU under TensorFlow it ends with `oneDNN on` or `off`)."""
    strategy = "" if info["strategy"] == "default" else f" ({info['strategy']})"
    xla = "XLA on" if info["jit_compile"] else "XLA off"
    onednn = ""
    if info["device"] == "cpu" and info.get("onednn") is not None:
        onednn = ", oneDNN on" if info["onednn"] else ", oneDNN off"
    return (
        f"backend {info['backend']}, {info['devices']} x {info['device']}{strategy}, "
        f"{info['dtype_policy']}, {xla}{onednn}"
    )
