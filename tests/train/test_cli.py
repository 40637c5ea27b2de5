"""`python -m train`'s entry point (train/cli.py): which commands turn TensorFlow's oneDNN
kernels on, and what the run records of it; the run context it builds and passes down
(train.strategy.RunContext), the only state of a run."""

import argparse
import importlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import types

import pytest

from tests.support.paths import ROOT
from tests.support.runs import training_env

X86 = platform.machine().lower() in ("x86_64", "amd64")

# Each case in a fresh interpreter that never imports TensorFlow (`--help` stops before
# the flags are used): the variable each command leaves in the environment.
_ASKED = """
import json, os, platform, sys
from train.cli import main

cases = json.loads(sys.argv[1])
seen = []
for name, preset, machine in cases:
    os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if preset is not None:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = preset
    platform.machine = lambda machine=machine: machine
    try:
        main([name, "--help"])
    except SystemExit:
        pass
    seen.append([os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "tensorflow" in sys.modules])
print(json.dumps(seen))
"""


def _child(script, *args, env=None):
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=env or training_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_sagan_asks_for_onednn_on_x86_unless_the_user_said_otherwise():
    cases = [
        ("sagan", None, "x86_64"),
        ("sagan", None, "AMD64"),
        ("sagan", "0", "x86_64"),  # the user's choice stands
        ("sagan", None, "aarch64"),  # Arm builds: TensorFlow's own default
        ("tagger", None, "x86_64"),  # no steady gain from oneDNN: TensorFlow decides
        ("seq2seq", None, "x86_64"),
    ]
    seen = json.loads(_child(_ASKED, json.dumps(cases)))
    values = [value for value, _ in seen]
    assert values == ["1", "1", "0", None, None, None], values
    assert not any(imported for _, imported in seen)  # set before TensorFlow reads it


def test_an_imported_tensorflow_is_left_alone(monkeypatch):
    """This process imported TensorFlow (conftest): the variable would change nothing here
    and only reach child processes, so it is not set."""
    from train.cli import prefer_onednn

    assert "tensorflow" in sys.modules
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    prefer_onednn()
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ


# TensorFlow's own answer after the variable, and the start line and `runtime` that a run
# prints and records from it.
_RUNTIME = """
import json
from train.cli import prefer_onednn
prefer_onednn()
from train import strategy
info = strategy.RunContext().runtime()
print(json.dumps([info["onednn"], strategy.describe_runtime(info)]))
"""


@pytest.mark.slow
@pytest.mark.skipif(not X86, reason="prefer_onednn asks for oneDNN on x86 only")
@pytest.mark.parametrize("preset, want", [(None, True), ("0", False)])
def test_runtime_says_whether_onednn_runs(preset, want):
    env = training_env()
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    if preset is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = preset
    onednn, line = json.loads(_child(_RUNTIME, env=env))
    assert onednn is want
    assert line.endswith("oneDNN on" if want else "oneDNN off"), line


_CONSTANT = (str, bytes, int, float, complex, bool, type(None), frozenset, range)


def _constant(value):
    if isinstance(value, tuple):
        return all(_constant(item) for item in value)
    return isinstance(value, _CONSTANT + (type, types.ModuleType, types.FunctionType))


@pytest.mark.parametrize("module", ["train.strategy", "train.preemption", "train.engine"])
def test_no_module_level_mutable_state(module):
    """A run's state lives in the RunContext the CLI builds (and its Signals), not in the
    module: every global is a module, class, function or an immutable constant."""
    found = {
        name: type(value).__name__
        for name, value in vars(importlib.import_module(module)).items()
        if not (name.startswith("__") and name.endswith("__")) and not _constant(value)
    }
    assert not found, f"{module} keeps module-level state: {found}"


def test_two_run_contexts_do_not_interfere():
    """Contexts of different flags keep their own settings and signals, a library
    `RunContext()` is one device with nothing to announce, and configuring one changes
    no environment variable (the entry point alone sets them)."""
    from train import strategy

    environ = dict(os.environ)
    a = strategy.configure(
        argparse.Namespace(strategy="default", checkpoint_every=3, jit_compile=True)
    )
    b = strategy.configure(
        argparse.Namespace(strategy="auto", mixed_precision="float32", jit_compile=False)
    )
    library = strategy.RunContext()
    assert dict(os.environ) == environ
    assert (a.name, a.checkpoint_every, a.jit_compile, a.announced) == ("default", 3, True, False)
    assert (b.name, b.checkpoint_every, b.jit_compile, b.mixed_precision) == (
        "auto",
        0,
        False,
        "float32",
    )
    assert (library.name, library.checkpoint_every, library.announced) == ("default", 0, True)
    with a.signals.listening():
        a.signals.handle(signal.SIGTERM, None)  # what the installed handler does
    assert a.signals.requested == signal.SIGTERM
    assert b.signals.requested is None and library.signals.requested is None
    with b:  # leaving one context takes back nothing of another's
        assert b.runtime()["jit_compile"] is False
    assert a.runtime()["jit_compile"] is True and a.runtime()["strategy"] == "default"


def test_leaving_a_run_context_takes_back_its_dtype_policy():
    import keras

    from train import strategy

    before = keras.mixed_precision.global_policy().name
    with strategy.RunContext(mixed_precision="mixed_bfloat16") as context:
        assert context.policy == "mixed_bfloat16"
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == before == "float32"
    with strategy.RunContext(mixed_precision="float32") as context:
        assert context.policy is None  # sets nothing, so takes back nothing
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.parametrize("has", [False, True, None])
def test_bfloat16_on_a_cpu_without_its_instructions_is_warned_of(monkeypatch, capsys, has):
    from train import strategy

    monkeypatch.setattr(strategy, "cpu_bfloat16", lambda: has)
    with strategy.RunContext(mixed_precision="mixed_bfloat16") as context:
        assert context.policy == "mixed_bfloat16"  # warned of, not replaced
    err = capsys.readouterr().err
    assert ("without bfloat16 instructions" in err) is (has is False)
    with strategy.RunContext(mixed_precision="float32") as context:
        assert context.policy is None
    assert capsys.readouterr().err == ""


def test_cpu_bfloat16_reads_the_x86_flags(tmp_path):
    from train.strategy import cpu_bfloat16

    def cpuinfo(text):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return str(path)

    zen4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16\n"
    cascade_lake = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n"
    sapphire_rapids = "flags\t\t: avx512f amx_tile amx_bf16 amx_int8\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16\n"
    assert cpu_bfloat16(cpuinfo(zen4)) is True
    assert cpu_bfloat16(cpuinfo(sapphire_rapids)) is True
    assert cpu_bfloat16(cpuinfo(cascade_lake)) is False
    assert cpu_bfloat16(cpuinfo(arm)) is None
    assert cpu_bfloat16(str(tmp_path / "missing")) is None


# --device cpu in a fresh interpreter: the entry point sets the variable the backend reads
# as it starts, before anything imports it (a bad --strategy then stops the command).
_DEVICE = """
import json, os, sys
from train.cli import main
seen = []
for backend, device in json.loads(sys.argv[1]):
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ.pop("JAX_PLATFORMS", None)
    code = main(["tagger", "--backend", backend, "--device", device, "--strategy", "bad"])
    seen.append([code, os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("JAX_PLATFORMS")])
seen.append(sorted(m for m in ("tensorflow", "jax") if m in sys.modules))
print(json.dumps(seen))
"""


def test_device_cpu_is_set_in_the_environment_by_the_entry_point():
    cases = {("tensorflow", "cpu"): [2, "-1", None], ("tensorflow", "auto"): [2, None, None]}
    if importlib.util.find_spec("jax") is not None:
        cases[("jax", "cpu")] = [2, None, "cpu"]
    env = training_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("JAX_PLATFORMS", None)
    seen = json.loads(_child(_DEVICE, json.dumps(list(cases)), env=env))
    assert seen == [*cases.values(), []], seen  # [] : neither backend imported
