"""SIGTERM / SIGINT during training: the run finishes its step, writes a checkpoint,
exits 143 / 130 with one line, and `--resume` ends where an uninterrupted run ends.

Real processes receive real signals (tagger, seq2seq, two workers of the tagger and of
the SAGAN). The SAGAN's one-process resume is checked in tests/train/test_sagan_checkpoint.py
(a signal sent to the test process itself)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.runs import training_env
from tests.train.test_checkpoint import ROOT, TINY, _main, _write_conllu
from train import checkpoint
from zoo.rundir import load_json as read_json

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

EPOCHS = 2


def _tagger(out, files, *extra):
    options = [f"--model-option={k}={json.dumps(v)}" for k, v in TINY.items()]
    return [
        sys.executable,
        "-m",
        "train",
        "tagger",
        "--out",
        str(out),
        "--epochs",
        str(EPOCHS),
        "--batch-size",
        "8",
        "--checkpoint-every",
        "2",
        "--seed",
        "3",
        *files,
        *options,
        *extra,
    ]


def _seq2seq(out, files, *extra):
    return [
        sys.executable,
        "-m",
        "train",
        "seq2seq",
        "--out",
        str(out),
        "--task",
        "reverse",
        "--train-size",
        "96",
        "--epochs",
        str(EPOCHS),
        "--batch-size",
        "8",
        "--hidden-dim",
        "16",
        "--num-layers",
        "1",
        "--num-heads",
        "2",
        "--intermediate-dim",
        "32",
        "--dev-sample",
        "0",
        "--verbose",
        "0",
        "--checkpoint-every",
        "2",
        "--seed",
        "3",
        *extra,
    ]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    from train.tagger import embedded

    root = tmp_path_factory.mktemp("preemption")
    data = embedded.generate(seed=1, train_size=240, dev_size=40, test_size=60)
    files = []
    for split in ("train", "dev", "test"):
        _write_conllu(root / f"{split}.conllu", getattr(data, split))
        files += [f"--{split}-file", str(root / f"{split}.conllu")]
    return root, files


def test_sigterm_mid_epoch_writes_a_checkpoint_and_resume_ends_like_an_uninterrupted_run(
    data_files, capsys
):
    """Real processes: the uninterrupted run and the signalled one run side by side."""
    root, files = data_files
    full = subprocess.Popen(
        _tagger(root / "full", files),
        cwd=ROOT,
        env=training_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = root / "stopped"
    proc = subprocess.Popen(
        _tagger(out, files),
        cwd=ROOT,
        env=training_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ckpt = out / "checkpoints"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            record = checkpoint.latest(ckpt)[1] if ckpt.exists() else None
            if record and record["epoch"] == 1 and record["batches_done"]:
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, (proc.returncode, err[-3000:])
        assert "Traceback" not in err
        path, record = _check_stop_line(err.strip().splitlines()[-1], "SIGTERM", ckpt)
        assert not (out / "metrics.json").exists()
        # The resume reads only the stopped run's files: it runs in this process.
        capsys.readouterr()
        assert _main(_tagger(out, files, "--resume")[3:]) == 0
        err = capsys.readouterr().err
        assert (
            f"at epoch 2, batch {record['batches_done']} of {EPOCHS} from "
            f"{os.path.basename(path)}" in err
        )
        assert full.wait(timeout=240) == 0, full.stderr.read()[-3000:]
    finally:
        for p in (full, proc):
            if p.poll() is None:
                p.kill()
                p.wait()
    _check_same_end(root / "full", out, ("test_accuracy", "dev_accuracy", "test_unseen_accuracy"))


def _check_stop_line(line, name, ckpt, epoch=2):
    match = re.fullmatch(
        rf"stopped by {name}: wrote (\S+step-(\d+)\.npz) at epoch {epoch}, batch (\d+); "
        r"continue with --resume",
        line,
    )
    assert match, line
    path, record, _ = checkpoint.latest(ckpt)
    assert path == match.group(1) and record["step"] == int(match.group(2))
    assert record["batches_done"] == int(match.group(3)) > 0
    # The signal came after a checkpoint every 2 steps; the stop wrote its own at once.
    return path, record


def _check_same_end(full, stopped, keys):
    a, b = read_json(full / "metrics.json"), read_json(stopped / "metrics.json")
    for key in keys:
        assert abs(a[key] - b[key]) <= 0.01, (key, a[key], b[key])
    history = checkpoint.latest(stopped / "checkpoints")[1]["state"]["history"]
    assert [h["epoch"] for h in history] == list(range(1, EPOCHS + 1))  # none redone, none lost
    # The stopped epoch's training loss is the mean over all its batches, before and
    # after the stop (the checkpoint carries the running sum).
    want = checkpoint.latest(full / "checkpoints")[1]["state"]["history"]
    for a_, b_ in zip(want, history):
        assert abs(a_["loss"] - b_["loss"]) <= 1e-3 * max(1.0, abs(a_["loss"])), (a_, b_)


def test_sigint_in_the_first_epoch_seq2seq_in_process(tmp_path, monkeypatch, capsys):
    """The same for seq2seq and SIGINT (Ctrl-C), sent by the process to itself right
    after its 5th training step (the CLI's handler, as in a real process). Stopped in
    the first epoch, the run has no model file yet: --resume rebuilds the model from
    config.json and vocab/spm.model and restores the step checkpoint into it."""
    from train.cli import main
    from train.model_step import TfModelStep

    def run(out, *extra):
        return main(_seq2seq(out, None, *extra)[3:])

    assert run(tmp_path / "full") == 0
    train = TfModelStep.train
    calls = []

    def signalling(self, batch, at):
        result = train(self, batch, at)
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(TfModelStep, "train", signalling)
    capsys.readouterr()
    stopped = tmp_path / "stopped"
    assert run(stopped) == 130
    err = capsys.readouterr().err
    path, record = _check_stop_line(
        err.strip().splitlines()[-1], "SIGINT", stopped / "checkpoints", epoch=1
    )
    assert record["batches_done"] == 5 and record["state"]["epoch"] == 0
    monkeypatch.setattr(TfModelStep, "train", train)
    assert run(stopped, "--resume") == 0
    err = capsys.readouterr().err
    assert f"at epoch 1, batch 5 of {EPOCHS} from {os.path.basename(path)}" in err
    _check_same_end(tmp_path / "full", stopped, ("test_exact_match",))


TWO_WORKER_EPOCHS = 10


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The one-device run (TWO_WORKER_EPOCHS epochs) that both two-worker tests compare
    with: the same command for both, so it runs once, started by the first of them
    beside its workers. `start()` starts it (once); `finish()` waits for it (once) and
    returns its output directory."""
    from tests.train.test_distributed import _finish, _start

    state = {}

    def start():
        if "proc" not in state:
            state["out"] = tmp_path_factory.mktemp("one-device") / "single"
            state["proc"] = _start(state["out"], "default", epochs=TWO_WORKER_EPOCHS)

    def finish():
        start()
        if "done" not in state:
            state["done"] = _finish([state["proc"]])
        return state["out"]

    yield start, finish
    proc = state.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("signalled", [1, 0], ids=["worker", "chief"])
def test_sigterm_to_one_of_two_workers_stops_both_and_resumes_in_one_process(
    tmp_path, signalled, one_device
):
    """A preempted VM signals its own worker only: both workers of a 2-worker run stop
    after the same step (train.preemption.ClusterStop, over the coordination service),
    the chief writes the checkpoint, both exit 143 with one line; the checkpoint resumes
    in one process and ends where one device ends (weights and their moving average)."""
    from tests.train.test_distributed import (
        TIMEOUT,
        _assert_same,
        _finish,
        _free_ports,
        _start,
        _weights,
    )

    epochs = TWO_WORKER_EPOCHS
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    start_single, finish_single = one_device
    start_single()
    workers = [
        _start(
            tmp_path / "multi",
            "multi_worker",
            epochs=epochs,
            tf_config={"cluster": cluster, "task": {"type": "worker", "index": i}},
        )
        for i in range(2)
    ]
    ckpt = tmp_path / "multi" / "checkpoints"
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and workers[signalled].poll() is None:
            if ckpt.exists() and checkpoint.list_checkpoints(ckpt):
                workers[signalled].send_signal(signal.SIGTERM)
                break
            time.sleep(0.02)
        outputs = [p.communicate(timeout=TIMEOUT)[0] for p in workers]
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in workers] == [143, 143], [o[-3000:] for o in outputs]
    path, record, _ = checkpoint.latest(ckpt)
    assert record["epoch"] < epochs - 1, "the run ended before the signal"
    where = (
        f"at epoch {record['epoch'] + 1}, batch {record['batches_done']}"
        if record["batches_done"]
        else f"at the end of epoch {record['epoch']}"
    )
    lines = [o.strip().splitlines()[-1] for o in outputs]
    how = ["SIGTERM on another worker", "SIGTERM on another worker"]
    how[signalled] = "SIGTERM"
    assert lines[0] == f"stopped by {how[0]}: wrote {path} {where}; continue with --resume", lines
    assert (
        lines[1]
        == f"stopped by {how[1]}: the chief wrote the checkpoint {where}; continue with --resume"
    ), lines
    (out,) = _finish([_start(tmp_path / "multi", "default", epochs=epochs, resume=True)])
    assert "replicas 1" in out and f"from {os.path.basename(path)}" in out
    single = finish_single()
    for kind in ("weights", "averaged"):
        _assert_same(
            _weights(tmp_path / "multi" / f"{kind}-e{epochs}-w0.npz"),
            _weights(single / f"{kind}-e{epochs}-w0.npz"),
            atol=1e-4,
        )


def _sagan_workers(out, extra_per_worker):
    """Two `python -m train sagan --strategy multi_worker` processes (SAGAN_TINY) into
    `out`; worker i gets `extra_per_worker[i]`. Returns the Popen objects."""
    from tests.train.test_distributed import _free_ports
    from tests.train.test_sagan_distributed import TINY as SAGAN_TINY

    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    workers = []
    for i, extra in enumerate(extra_per_worker):
        env = training_env({"cluster": cluster, "task": {"type": "worker", "index": i}})
        workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "train",
                    "sagan",
                    "--strategy",
                    "multi_worker",
                    "--out",
                    str(out),
                    "--verbose",
                    "0",
                    *SAGAN_TINY,
                    *extra,
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return workers


def _wait_all(workers, timeout, signal_when=None):
    """stderr of every worker; with `signal_when` (a path), SIGTERM to worker 1 once it
    exists. Kills whatever is left."""
    try:
        if signal_when is not None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and workers[1].poll() is None:
                if signal_when.exists():
                    workers[1].send_signal(signal.SIGTERM)
                    break
                time.sleep(0.02)
        return [p.communicate(timeout=timeout)[1] for p in workers]
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_sigterm_to_one_of_two_sagan_workers_stops_both_at_one_step(tmp_path):
    """The SAGAN loop shares a signal the same way (ClusterStop): SIGTERM to the worker
    stops both after the same D step; the chief's checkpoint records that step, both
    exit 143 with one line, and --resume on one device finishes the run."""
    from tests.train.test_distributed import TIMEOUT

    epochs = 12  # 4 D steps each: far more than the first checkpoint needs
    out = tmp_path / "run"
    ckpt = out / "checkpoints"
    workers = _sagan_workers(out, [["--epochs", str(epochs), "--checkpoint-every", "2"]] * 2)
    errors = _wait_all(workers, TIMEOUT, signal_when=ckpt / "step-00000002.npz")
    assert [p.returncode for p in workers] == [143, 143], [e[-3000:] for e in errors]
    npz, saved, _ = checkpoint.latest(ckpt)
    assert saved["epoch"] < epochs - 1, "the run ended before the signal"
    lines = [e.strip().splitlines()[-1] for e in errors]
    where = (
        f"at epoch {saved['epoch'] + 1}, batch {saved['batches_done']}"
        if saved["batches_done"]
        else f"at the end of epoch {saved['epoch']}"
    )
    assert (
        lines[0]
        == f"stopped by SIGTERM on another worker: wrote {npz} {where}; continue with --resume"
    ), lines
    assert (
        lines[1]
        == f"stopped by SIGTERM: the chief wrote the checkpoint {where}; continue with --resume"
    ), lines
    # On one device, in this process (it reads only the run's files), to the end of the
    # epoch after the stop: the stopped epoch's remaining steps and a whole one.
    until = saved["epoch"] + 2
    assert (
        _main(["sagan", "--out", str(out), "--resume", "--epochs", str(until), "--verbose", "0"])
        == 0
    )
    final = checkpoint.latest(ckpt)[1]["state"]
    assert final["epoch"] == until and final["step"] == until * 4


def test_two_sagan_workers_end_at_one_step_when_the_chief_runs_out_of_time(tmp_path):
    """--max-minutes under two workers: each worker's own clock would end it at another
    step and take down or stall the other's collective; the chief's clock and budget
    decide and both end after the same step (ClusterStop.clock), exit 0. The skew is
    made certain here: the other worker's budget is two thirds of the chief's (18 s and
    12 s, both past the first steps' tracing, ~10 s)."""
    from tests.train.test_distributed import TIMEOUT

    epochs = 400  # never reached: the time limit ends the run
    out = tmp_path / "run"
    workers = _sagan_workers(
        out, [["--epochs", str(epochs), "--max-minutes", m] for m in ("0.3", "0.2")]
    )
    errors = _wait_all(workers, TIMEOUT)
    assert [p.returncode for p in workers] == [0, 0], [e[-3000:] for e in errors]
    metrics = read_json(out / "metrics.json")
    assert metrics["stopped_by_time_limit"] and 0 < metrics["d_steps"] < epochs * 4
