"""Runs a module under Keras's JAX backend, in a subprocess.

Keras fixes its backend when it is first imported, and the test process has
TensorFlow's: the checks of layers/ under JAX run in a child with
`KERAS_BACKEND=jax` on JAX's CPU backend. `python -m tests.support.backends
--without-tensorflow MODULE ARGS...` runs `python -m MODULE ARGS...` with
`import tensorflow` made impossible (the GPU machine has no TensorFlow).
"""

import os
import runpy
import subprocess
import sys

from tests.support.paths import ROOT

WITHOUT_TENSORFLOW = "--without-tensorflow"
THIS = "tests.support.backends"  # this module, also when run as __main__

# The tests' XLA programs compile with LLVM at -O0. The programs (HLO, its fusions and
# buffers) are the ones a user's run compiles; only their machine code is less
# optimised, which tiny test shapes never notice, while compiling is most of a tiny
# JAX run's time (each weight initializer's threefry `uniform` is a program of its own).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def jax_env(xla_flags="", **extra):
    """The environment of a child under Keras's JAX backend on JAX's CPU backend:
    os.environ without PYTHONPATH and XLA_FLAGS, then `TEST_XLA_FLAGS` plus `xla_flags`
    (e.g. a host device count), then `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    env["XLA_FLAGS"] = f"{TEST_XLA_FLAGS} {xla_flags}".strip()
    env.update(extra)
    return env


def run_under_jax(module, *args, timeout=600, without_tensorflow=False):
    """`python -m module *args` in `jax_env()` (`KERAS_BACKEND=jax`, JAX on the CPU).

    Skips the calling test where JAX is not installed; fails it, with the
    child's output and the tail of its errors, unless the child exits 0.

    Args:
        module: the module to run, e.g. `"tests.layers.test_attention_fused"`.
        *args: its command-line arguments.
        timeout: seconds before the child is killed (and the test fails).
        without_tensorflow: make `import tensorflow` fail in the child.

    Returns:
        The child's stdout.
    """
    import pytest

    pytest.importorskip("jax")
    env = jax_env(PYTHONPATH=ROOT)
    argv = [sys.executable, "-m", module, *args]
    if without_tensorflow:
        argv = [sys.executable, "-m", THIS, WITHOUT_TENSORFLOW, module, *args]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


class _BlockTensorFlow:
    """A meta path finder that refuses `tensorflow` and its submodules."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError("tensorflow is blocked here")


def main(argv):
    if len(argv) < 2 or argv[0] != WITHOUT_TENSORFLOW:
        raise SystemExit(f"usage: python -m {THIS} {WITHOUT_TENSORFLOW} MODULE [ARGS...]")
    module = argv[1]
    sys.meta_path.insert(0, _BlockTensorFlow())
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
