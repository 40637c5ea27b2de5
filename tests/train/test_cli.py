"""`python -m train`'s entry point (train/cli.py): which commands turn TensorFlow's oneDNN
kernels on, and what the run records of it."""

import json
import os
import platform
import subprocess
import sys

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
