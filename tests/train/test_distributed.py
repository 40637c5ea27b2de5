"""tf.distribute through the training engine: 2 workers == mirrored == 1 device.

Every run is a separate process (tests/support/dist_tagger_worker.py): collective ops and logical
devices are configured at process start. Workers talk over 127.0.0.1 ports chosen now.
"""

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.support import paths
from tests.support.runs import training_env

ROOT = pathlib.Path(paths.ROOT)
WORKER = ROOT / "tests" / "support" / "dist_tagger_worker.py"
TIMEOUT = 240


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _start(out, strategy, epochs=1, resume=False, tf_config=None):
    cmd = [
        sys.executable,
        str(WORKER),
        "--strategy",
        strategy,
        "--out",
        str(out),
        "--epochs",
        str(epochs),
    ]
    if resume:
        cmd.append("--resume")
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=training_env(tf_config),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(procs):
    """Waits for all (bounded); kills every one that is left; returns their outputs."""
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    return outputs


def _weights(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def _assert_same(a, b, atol=1e-5):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-epoch single-device reference, a 1-epoch 2-worker run and a mirrored run, in parallel."""
    base = tmp_path_factory.mktemp("dist")
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = [_start(base / "single", "default", epochs=2)]
    procs += [
        _start(
            base / "multi",
            "multi_worker",
            tf_config={"cluster": cluster, "task": {"type": "worker", "index": i}},
        )
        for i in range(2)
    ]
    procs.append(_start(base / "mirrored", "mirrored"))
    outputs = _finish(procs)
    return base, outputs


@pytest.mark.slow
def test_two_workers_equal_each_other_and_one_device(runs):
    base, outputs = runs
    assert "replicas 2" in outputs[1] and "replicas 2" in outputs[2]
    for kind in ("weights", "averaged"):  # the raw weights and the optimizer's EMA of them
        w0 = _weights(base / "multi" / f"{kind}-e1-w0.npz")
        w1 = _weights(base / "multi" / f"{kind}-e1-w1.npz")
        single = _weights(base / "single" / f"{kind}-e1-w0.npz")
        _assert_same(w0, w1, atol=0)
        _assert_same(w0, single)
        # and training moved them (the comparison is not between initial values)
        initial_moved = any(
            not np.allclose(a, b)
            for a, b in zip(single, _weights(base / "single" / f"{kind}-e2-w0.npz"))
        )
        assert initial_moved, kind
    # the average is not the raw weights
    assert any(
        not np.allclose(a, b)
        for a, b in zip(
            _weights(base / "single" / "weights-e1-w0.npz"),
            _weights(base / "single" / "averaged-e1-w0.npz"),
        )
    )


def test_mirrored_on_two_devices_equals_one_device(runs):
    base, outputs = runs
    assert "replicas 2" in outputs[3]
    for kind in ("weights", "averaged"):
        _assert_same(
            _weights(base / "mirrored" / f"{kind}-e1-w0.npz"),
            _weights(base / "single" / f"{kind}-e1-w0.npz"),
        )


def test_only_the_chief_wrote_checkpoints(runs):
    base, _ = runs
    from train import checkpoint

    names = [
        os.path.basename(p) for p in checkpoint.list_checkpoints(base / "multi" / "checkpoints")
    ]
    assert names == ["step-00000002.npz", "step-00000003.npz"]
    assert not [p for p in os.listdir(base / "multi" / "checkpoints") if p.startswith(".tmp")]


@pytest.mark.slow
def test_two_worker_checkpoint_resumes_in_one_process(runs, tmp_path):
    base, _ = runs
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(base / "multi" / "checkpoints", resumed / "checkpoints")
    (out,) = _finish([_start(resumed, "default", epochs=2, resume=True)])
    assert "replicas 1" in out and "after epoch 1 of 2 from step-00000003.npz" in out
    # 1 epoch on 2 workers + 1 epoch in one process == 2 epochs in one process, the
    # moving average (optimizer state in the checkpoint) included
    for kind in ("weights", "averaged"):
        _assert_same(
            _weights(resumed / f"{kind}-e2-w0.npz"), _weights(base / "single" / f"{kind}-e2-w0.npz")
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, env, needle",
    [
        (["tagger", "--strategy", "bogus"], None, "unknown --strategy 'bogus'"),
        (["tagger", "--checkpoint-every", "-1"], None, "--checkpoint-every must be >= 0, got -1"),
        (["tagger", "--strategy", "multi_worker"], None, "needs TF_CONFIG"),
        (
            ["tagger", "--strategy", "multi_worker"],
            "{bad",
            "TF_CONFIG is not valid cluster JSON: '{bad'",
        ),
        (
            ["sagan", "--strategy", "mirrored", "--batch-size", "0"],
            None,
            "--batch-size must be >= 1, got 0",
        ),
    ],
)
def test_bad_distribution_flags_one_line_exit_2(argv, env, needle, tmp_path, capsys, monkeypatch):
    from train.cli import main

    monkeypatch.delenv("TF_CONFIG", raising=False)
    if env is not None:
        monkeypatch.setenv("TF_CONFIG", env)
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "run").exists()
