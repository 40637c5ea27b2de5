"""`python -m train sagan` checkpoints (train.engine + train.checkpoint): a run whose last
checkpoint is a step checkpoint resumes with the next batch of the same epoch and ends
where the uninterrupted run ends (weights, optimizers, EMA, the epochs' loss history,
the kept best generator); damaged checkpoints and classifier fall back or are refused."""

import os
import pathlib
import shutil

import pytest

from tests.train.test_sagan_distributed import TINY, _assert_equals_single
from train import checkpoint

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

# TINY: 4 D steps per epoch. Every 3 D steps: step checkpoints inside epoch 1 (after
# batch 3) and epoch 2 (after batch 2); the quick FID makes epoch 1's initial FID and
# every epoch's FID (and the kept best epoch) part of what must match.
ARGS = ["--epochs", "2", "--checkpoint-every", "3", *TINY, "--epoch-eval-samples", "16"]


class _Killed(BaseException):
    """Not an Exception: passes the CLI's error handling like a SIGKILL would."""


def _main(argv, kill_after_d_steps=None, keep=None):
    """Runs the CLI. `kill_after_d_steps`: stops dead right after the step checkpoint
    written within an epoch at that D step. `keep`: a folder that receives a copy of
    every such step checkpoint."""
    from train.cli import main

    save = checkpoint.save

    def spy(directory, groups, record, **kwargs):
        path = save(directory, groups, record, **kwargs)
        if kwargs.get("name", "step") == "step" and record["batches_done"]:
            if keep is not None:
                shutil.copy(path, keep)
            if record["step"] == kill_after_d_steps:
                raise _Killed
        return path

    checkpoint.save = spy
    try:
        return main(argv)
    finally:
        checkpoint.save = save


def _newest(run):
    return checkpoint.latest(run / "checkpoints")


def _relative(base, path):
    return os.path.relpath(path, base)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run (tmp/single), with a copy of each step checkpoint written
    within an epoch (tmp/kept)."""
    base = tmp_path_factory.mktemp("sagan_checkpoint")
    (base / "kept").mkdir()
    assert _main(["sagan", "--out", str(base / "single"), *ARGS], keep=str(base / "kept")) == 0
    return base


def test_step_checkpoints_resume_mid_epoch_and_end_where_the_uninterrupted_run_ends(uninterrupted):
    tmp_path = uninterrupted
    single, killed, kept = tmp_path / "single", tmp_path / "killed", tmp_path / "kept"
    assert sorted(os.listdir(kept)) == ["step-00000003.npz", "step-00000006.npz"]
    record = checkpoint.read_record(kept / "step-00000003.npz")
    assert (record["epoch"], record["batches_done"], record["step"]) == (0, 3, 3)
    assert record["state"]["history"] == [] and record["state"].get("best") is None
    # The epoch's running sums: 3 D steps, 1 G step (--n-dis 2).
    assert record["partial"]["d_loss"][1] == 3 and record["partial"]["g_loss"][1] == 1

    # The run as a kill right after the step checkpoint of epoch 1 left it: then killed
    # again inside epoch 2.
    shutil.copytree(single, killed)
    for name in ("step", "best"):
        for path in checkpoint.list_checkpoints(killed / "checkpoints", name):
            os.unlink(path)
    shutil.copy(kept / "step-00000003.npz", killed / "checkpoints")
    resume = ["sagan", "--out", str(killed), "--resume", "--checkpoint-every", "3"]
    with pytest.raises(_Killed):
        _main(resume, kill_after_d_steps=6)
    _, record, _ = _newest(killed)
    assert (record["epoch"], record["batches_done"], record["step"]) == (1, 2, 6)
    want = checkpoint.read_record(kept / "step-00000006.npz")
    assert record["state"] == want["state"] | {"train_seconds": record["state"]["train_seconds"]}
    assert record["partial"] == want["partial"]

    assert _main(resume) == 0
    path, got, _ = _newest(killed)
    want_path, want, _ = _newest(single)
    _assert_equals_single(tmp_path, path, _relative(tmp_path, want_path))
    got, want = got["state"], want["state"]
    assert got["step"] == want["step"] == 8 and got["epoch"] == 2
    assert got["history"] == want["history"] and got["initial_fid"] == want["initial_fid"]
    assert got["best"] == want["best"]
    assert [h["steps"] for h in got["history"]] == [4, 4]
    metrics = (killed / "metrics.json").read_text()
    assert '"jit_compile": false' in metrics  # --jit-compile is off by default on CPU


def test_sigterm_mid_epoch_saves_the_step_and_resume_ends_where_the_uninterrupted_run_ends(
    uninterrupted, capsys
):
    """SIGTERM (sent by the process to itself, through the CLI's handler) right after
    D step 5, the first batch of epoch 2: the step is saved, exit 143 with one line,
    and --resume continues with batch 2 to the uninterrupted run's final state."""
    import signal

    from train.sagan.fit import TfSaganStep

    base = uninterrupted
    stopped = base / "stopped"
    train = TfSaganStep.train

    def signalling(self, batch, at):
        logs = train(self, batch, at)
        if at.step + 1 == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return logs

    TfSaganStep.train = signalling
    try:
        capsys.readouterr()
        assert _main(["sagan", "--out", str(stopped), *ARGS]) == 143
    finally:
        TfSaganStep.train = train
    last = capsys.readouterr().err.strip().splitlines()[-1]
    path, record, _ = _newest(stopped)
    assert last == (f"stopped by SIGTERM: wrote {path} at epoch 2, batch 1; continue with --resume")
    assert (record["epoch"], record["batches_done"], record["step"]) == (1, 1, 5)
    assert len(record["state"]["history"]) == 1
    assert not (stopped / "metrics.json").exists()
    assert _main(["sagan", "--out", str(stopped), "--resume", "--checkpoint-every", "3"]) == 0
    assert "resuming" in capsys.readouterr().err
    path, got, _ = _newest(stopped)
    want_path, want, _ = _newest(base / "single")
    _assert_equals_single(base, path, _relative(base, want_path))
    assert got["step"] == want["step"] == 8
    assert got["state"]["history"] == want["state"]["history"]


# ---------------------------------------------------------------------------
# --resume with damaged files: the newest step checkpoint (the previous one, said),
# every one (refused), the cached classifier (trained again).


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_resume_falls_back_past_a_damaged_checkpoint_and_retrains_a_damaged_classifier(
    uninterrupted, capsys
):
    """The finished run with its newest step checkpoint truncated and its cached
    classifier damaged: --resume says so, one line each, restores the step checkpoint
    after D step 6, trains the classifier again and ends where the uninterrupted run
    ends."""
    base = uninterrupted
    run = base / "damaged"
    shutil.copytree(base / "single", run)
    ckpt = run / "checkpoints"
    _truncate(ckpt / "step-00000008.npz")
    (classifier,) = checkpoint.list_checkpoints(ckpt, "classifier")
    _truncate(pathlib.Path(classifier))
    capsys.readouterr()
    assert _main(["sagan", "--out", str(run), "--resume", "--checkpoint-every", "3"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "falling back" in line] == [
        f"checkpoint {ckpt / 'step-00000008.npz'} cannot be read (File is not a zip file); "
        f"falling back to step-00000006.npz"
    ]
    assert [line for line in err if "again" in line] == [
        f"checkpoint {classifier} cannot be read (File is not a zip file); "
        f"training the evaluation classifier again"
    ]
    assert f"resuming {run} at epoch 2, batch 2 of 2 from step-00000006.npz" in err
    path, got, _ = _newest(run)
    want_path, want, _ = _newest(base / "single")
    _assert_equals_single(base, path, _relative(base, want_path))
    # The classifier trained again from the same data and seed measures the same FIDs.
    got, want = got["state"], want["state"]
    assert got["step"] == want["step"] == 8
    assert got["history"] == want["history"] and got["initial_fid"] == want["initial_fid"]
    assert checkpoint.latest(ckpt, "classifier")[0] == classifier  # written again, whole


def test_resume_with_no_good_checkpoint_is_refused_in_one_line(uninterrupted, capsys):
    base = uninterrupted
    run = base / "all_damaged"
    shutil.copytree(base / "single", run)
    ckpt = run / "checkpoints"
    for path in checkpoint.list_checkpoints(ckpt):
        _truncate(pathlib.Path(path))
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    capsys.readouterr()
    assert _main(["sagan", "--out", str(run), "--resume"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        f"error: checkpoint {ckpt / 'step-00000008.npz'} cannot be read (File is not a zip "
        f"file); no earlier checkpoint to fall back to"
    ], err
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


# ---------------------------------------------------------------------------
# The SAGAN step's checkpoint variables: keyed by variable path, refused when other.


def test_sagan_restore_refuses_other_variables_naming_the_first(tmp_path):
    import numpy as np

    from tests.train.test_sagan_distributed import _tiny_trainer
    from zoo.cli import UsageError

    saved = _tiny_trainer(attention=16, with_ema=True)
    path = checkpoint.save(str(tmp_path), saved.variables(), {"step": 1}, refs=saved.refs())
    other = _tiny_trainer(with_ema=True)  # no attention block: G and D lack its variables
    before = [np.array(v.numpy()) for vs in other.variables().values() for v in vs]
    with pytest.raises(
        UsageError,
        match=r"does not fit this model: g variable '[^']*attention[^']*' is in the "
        r"checkpoint but not in this model",
    ):
        checkpoint.restore(path, other.variables(), refs=other.refs())
    after = [np.array(v.numpy()) for vs in other.variables().values() for v in vs]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
