"""The command lines' shared contract (zoo/cli.py): the runtimes' start-up lines
filtered out of stderr, real problems kept in one line of ours, a crash's last
words kept; a bare command is a usage error on stderr with exit 2 and nothing on
stdout. The commands on real exports: tests/zoo/test_lite.py."""

import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

# What TensorFlow, absl, CUDA and LiteRT print at start-up on a CPU machine
# (seen on this stack), and two real problems.
NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796405840.776083    9087 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1796405870.108711    9093 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0000 00:00:1796405870.1 9093 port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors.",
    "I0000 00:00:1796405870.2 9093 cpu_feature_guard.cc:210] This TensorFlow binary is optimized "
    "to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
]
PROBLEM = (
    "W0000 00:00:1796405870.3 9093 gpu_device.cc:2344] Cannot dlopen some GPU libraries. "
    "Please make sure the missing libraries mentioned above are installed properly."
)

_CHILD = r"""
import os, sys
from zoo.cli import runtime_logs
lines, verbose, crash = sys.argv[1].split("\n"), int(sys.argv[2]), sys.argv[3] == "1"
with runtime_logs(verbose):
    for line in lines + lines:  # each line twice
        os.write(2, (line + "\n").encode())
    print("python's own stderr line", file=sys.stderr)
    print("a result")
    if crash:
        os.write(2, b"F0000 00:00:1.0 1 check.cc:1] Check failed: crash's last words\n")
        os.abort()
"""


def _child(lines, verbose=1, crash=False):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", _CHILD, "\n".join(lines), str(verbose), "1" if crash else "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_start_up_lines_are_dropped_and_a_real_problem_is_one_line():
    done = _child(NOISE + [PROBLEM])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a result\n"
    # Two paths to the terminal (the filter's, Python's own): either may come first.
    assert sorted(done.stderr.splitlines()) == [
        "python's own stderr line",
        "warning: TensorFlow runtime: Cannot dlopen some GPU libraries. Please make sure the "
        "missing libraries mentioned above are installed properly.",
    ]


def test_verbose_2_filters_nothing():
    done = _child(NOISE + [PROBLEM], verbose=2)
    assert done.stderr.splitlines() == NOISE + [PROBLEM] + NOISE + [PROBLEM] + [
        "python's own stderr line"
    ]


def test_a_crash_keeps_its_last_words():
    done = _child(NOISE, crash=True)
    assert done.returncode != 0
    assert "Check failed: crash's last words" in done.stderr
    assert "cuInit" not in done.stderr and "XNNPACK" not in done.stderr


def test_cuinit_is_a_real_problem_where_a_gpu_driver_is_loaded():
    """Only the cuInit line, without "Could not find cuda drivers" before it, on a
    machine with NVIDIA's driver: reported. Without the driver: noise."""
    done = _child([NOISE[2]])
    if os.path.exists("/proc/driver/nvidia/version"):
        assert "warning: TensorFlow runtime: failed call to cuInit" in done.stderr
    else:
        assert "cuInit" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    ["train", "export", "export.kinds.seq2seq", "zoo.tag", "zoo.translate", "zoo.generate",
     "zoo.console"],
)  # fmt: skip
def test_a_bare_command_is_a_usage_error_on_stderr(module):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, ""), (done.stdout, done.stderr)
    assert done.stderr.startswith(("usage:", "error:")), done.stderr
    assert "Traceback" not in done.stderr


def test_tensorflow_retracing_advice_is_dropped_below_verbose_2(caplog):
    import logging

    from zoo.cli import runtime_logs

    log = logging.getLogger("tensorflow")
    advice = "5 out of the last 28 calls to <f> triggered tf.function retracing. Tracing is..."
    for verbose, shown in ((1, False), (2, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tensorflow"), runtime_logs(verbose):
            log.warning(advice)
            log.warning("a real warning")
        messages = [r.getMessage() for r in caplog.records]
        assert "a real warning" in messages and (advice in messages) == shown, messages
    assert log.filters == []  # the filter ends with the command


_IMPORT_KERAS = """
import sys
from zoo.cli import import_keras_quietly
import_keras_quietly()
print(sorted(m for m in ("jax", "keras", "tensorflow") if sys.modules.get(m) is not None))
import jax.numpy
print(float(jax.numpy.ones(2).sum()))
"""


@pytest.mark.slow  # imports TensorFlow in a fresh process
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_commands_import_tensorflow_without_jax_and_jax_still_imports(backend):
    """The commands' Keras import (zoo.cli.import_keras_quietly) leaves out the jax import
    tf.lite makes for its JAX converter under the TensorFlow backend; jax imports as usual
    afterwards, and under the JAX backend Keras imports jax as its backend."""
    env = {**os.environ, "KERAS_BACKEND": backend}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_KERAS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {"tensorflow": "['keras', 'tensorflow']", "jax": "['jax', 'keras']"}[backend]
    assert done.stdout.split("\n")[:2] == [imported, "2.0"], done.stdout
