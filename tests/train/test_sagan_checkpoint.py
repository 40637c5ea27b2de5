"""`python -m train sagan --checkpoint-every N`: a run whose last checkpoint is a step
checkpoint resumes with the next batch of the same epoch and ends where the
uninterrupted run ends (weights, optimizers, EMA, the epochs' loss history)."""

import json
import os
import shutil

import pytest

from tests.train.test_sagan_distributed import TINY, _assert_equals_single

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

# TINY: 4 D steps per epoch. Every 3 D steps: step checkpoints inside epoch 1 (after
# batch 3) and epoch 2 (after batch 2); the quick FID makes epoch 1's initial FID and
# every epoch's FID part of what must match.
ARGS = ["--epochs", "2", "--checkpoint-every", "3", *TINY, "--epoch-eval-samples", "16"]


class _Killed(BaseException):
    """Not an Exception: passes the CLI's error handling like a SIGKILL would."""


def _main(argv, kill_after_d_steps=None, keep=None):
    """Runs the CLI. `kill_after_d_steps`: stops dead right after the step checkpoint
    written at that D step. `keep`: a folder that receives a copy of every step
    checkpoint (state-<d_steps>.npz / .json)."""
    from train import strategy as dist
    from train.cli import main
    from train.sagan.fit import STATE_JSON, STATE_NPZ, SaganTrainer

    save = SaganTrainer.save

    def spy(self, directory, state):
        save(self, directory, state)
        if not state.get("batches_done"):
            return
        if keep is not None:
            for name in (STATE_NPZ, STATE_JSON):
                stem, ext = os.path.splitext(name)
                copy = os.path.join(keep, f"{stem}-{state['d_steps']}{ext}")
                shutil.copy(os.path.join(directory, name), copy)
        if state["d_steps"] == kill_after_d_steps:
            raise _Killed

    SaganTrainer.save = spy
    try:
        return main(argv)
    finally:
        SaganTrainer.save = save
        dist.reset()


def _json(path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run (tmp/single), with a copy of each step checkpoint (tmp/kept)."""
    base = tmp_path_factory.mktemp("sagan_checkpoint")
    (base / "kept").mkdir()
    assert _main(["sagan", "--out", str(base / "single"), *ARGS], keep=str(base / "kept")) == 0
    return base


def test_step_checkpoints_resume_mid_epoch_and_end_where_the_uninterrupted_run_ends(uninterrupted):
    tmp_path = uninterrupted
    single, killed, kept = tmp_path / "single", tmp_path / "killed", tmp_path / "kept"
    assert sorted(os.listdir(kept)) == [
        "state-3.json",
        "state-3.npz",
        "state-6.json",
        "state-6.npz",
    ]
    state = _json(kept / "state-3.json")
    assert (state["epoch"], state["batches_done"], state["d_steps"], state["history"]) == (
        0,
        3,
        3,
        [],
    )
    assert len(state["partial_logs"]["d_loss"]) == 3 and len(state["partial_logs"]["g_loss"]) == 1

    # The run as a kill right after the step checkpoint of epoch 1 left it (its later
    # files are overwritten by the resumed run): then killed again inside epoch 2.
    shutil.copytree(single, killed)
    for name in ("state.npz", "state.json"):
        stem, ext = os.path.splitext(name)
        shutil.copy(kept / f"{stem}-3{ext}", killed / "checkpoints" / name)
    resume = ["sagan", "--out", str(killed), "--resume", "--checkpoint-every", "3"]
    with pytest.raises(_Killed):
        _main(resume, kill_after_d_steps=6)
    state = _json(killed / "checkpoints" / "state.json")
    assert (state["epoch"], state["batches_done"], state["d_steps"], len(state["history"])) == (
        1,
        2,
        6,
        1,
    )
    assert state == _json(kept / "state-6.json") | {"train_seconds": state["train_seconds"]}

    assert _main(resume) == 0
    _assert_equals_single(
        tmp_path, killed / "checkpoints" / "state.npz", "single/checkpoints/state.npz"
    )
    want, got = (
        _json(single / "checkpoints" / "state.json"),
        _json(killed / "checkpoints" / "state.json"),
    )
    assert got["d_steps"] == want["d_steps"] == 8 and "batches_done" not in got
    assert got["history"] == want["history"] and got["initial_fid"] == want["initial_fid"]
    assert [h["steps"] for h in got["history"]] == [4, 4]
    metrics = _json(killed / "metrics.json")
    assert metrics["distribution"]["jit_compile"] is False  # --jit-compile is off by default on CPU


# ---------------------------------------------------------------------------
# SaganTrainer.save/restore: keyed by variable path, config hash, checksum, fallback.


def _trainer(**kwargs):
    from tests.train.test_sagan_distributed import _tiny_trainer

    return _tiny_trainer(with_ema=True, **kwargs)


def _values(trainer):
    import numpy as np

    return [np.array(v.numpy()) for group in trainer._groups().values() for v in group]


def _step(trainer, step=0):
    import numpy as np

    rng = np.random.default_rng(step)
    real = rng.uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
    trainer.train_batch(real, rng.integers(0, 4, size=4).astype("int32"), step)


def test_sagan_state_keeps_the_previous_one_and_falls_back_to_it(tmp_path, capsys):
    import numpy as np

    trainer = _trainer()
    _step(trainer, 0)
    trainer.save(str(tmp_path), {"epoch": 1})
    first = _values(trainer)
    _step(trainer, 1)
    trainer.save(str(tmp_path), {"epoch": 2})
    assert sorted(os.listdir(tmp_path)) == ["state.json", "state.npz", "state.prev.npz"]
    restored = _trainer()
    assert restored.restore(str(tmp_path))["epoch"] == 2
    data = (tmp_path / "state.npz").read_bytes()
    (tmp_path / "state.npz").write_bytes(data[: len(data) // 2])  # truncated (a full disk, a crash)
    capsys.readouterr()
    restored = _trainer()
    assert restored.restore(str(tmp_path))["epoch"] == 1
    assert "falling back to state.prev.npz" in capsys.readouterr().err
    assert all(np.array_equal(a, b) for a, b in zip(first, _values(restored)))
    # A missing state.npz (deleted, lost in a copy) falls back too, and says so.
    (tmp_path / "state.npz").unlink()
    restored = _trainer()
    assert restored.restore(str(tmp_path))["epoch"] == 1
    assert capsys.readouterr().err.strip() == (
        f"checkpoint {tmp_path / 'state.npz'} is missing; falling back to state.prev.npz"
    )
    (tmp_path / "state.prev.npz").write_bytes(b"not a zip")  # and nothing good is left
    from zoo.cli import UsageError

    with pytest.raises(UsageError, match="state.prev.npz cannot be read .*; no earlier checkpoint"):
        _trainer().restore(str(tmp_path))


def test_sagan_restore_refuses_other_variables_naming_the_first(tmp_path):
    from zoo.cli import UsageError

    _trainer(attention=16).save(str(tmp_path), {"epoch": 1})
    other = _trainer()  # no attention block: G and D lack its variables
    before = _values(other)
    with pytest.raises(
        UsageError,
        match=r"does not fit this model: g variable '[^']*attention[^']*' is in the "
        r"checkpoint but not in this model",
    ):
        other.restore(str(tmp_path))
    import numpy as np

    assert all(np.array_equal(a, b) for a, b in zip(before, _values(other)))


def test_sagan_positional_state_still_restores(tmp_path, capsys):
    """A state.npz of the first format (`g/0`, `g/1`, ...: by position) still resumes."""
    import numpy as np

    trainer = _trainer()
    _step(trainer, 0)
    arrays = {
        f"{name}/{i}": np.asarray(v.numpy())
        for name, variables in trainer._groups().items()
        for i, v in enumerate(variables)
    }
    arrays["__state__"] = np.array(json.dumps({"epoch": 4}))
    np.savez(tmp_path / "state.npz", **arrays)
    restored = _trainer()
    assert restored.restore(str(tmp_path)) == {"epoch": 4}
    assert all(np.array_equal(a, b) for a, b in zip(_values(trainer), _values(restored)))
    assert "positional checkpoint" in capsys.readouterr().err


def test_sigterm_mid_epoch_saves_the_step_and_resume_ends_where_the_uninterrupted_run_ends(
    uninterrupted, capsys
):
    """SIGTERM (sent by the process to itself, through the CLI's handler) right after
    D step 5, the first batch of epoch 2: the step is saved, exit 143 with one line,
    and --resume continues with batch 2 to the uninterrupted run's final state."""
    import signal

    from train.sagan.fit import SaganTrainer

    base = uninterrupted
    stopped = base / "stopped"
    train_batch = SaganTrainer.train_batch

    def signalling(self, real, labels, d_steps_done):
        logs = train_batch(self, real, labels, d_steps_done)
        if d_steps_done + 1 == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return logs

    SaganTrainer.train_batch = signalling
    try:
        capsys.readouterr()
        assert _main(["sagan", "--out", str(stopped), *ARGS]) == 143
    finally:
        SaganTrainer.train_batch = train_batch
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        f"stopped by SIGTERM: wrote {stopped / 'checkpoints' / 'state.npz'} at epoch 2, batch 1; "
        f"continue with --resume"
    )
    state = _json(stopped / "checkpoints" / "state.json")
    assert (state["epoch"], state["batches_done"], state["d_steps"], len(state["history"])) == (
        1,
        1,
        5,
        1,
    )
    assert not (stopped / "metrics.json").exists()
    assert _main(["sagan", "--out", str(stopped), "--resume", "--checkpoint-every", "3"]) == 0
    assert "resuming" in capsys.readouterr().err
    _assert_equals_single(
        base, stopped / "checkpoints" / "state.npz", "single/checkpoints/state.npz"
    )
    want, got = (
        _json(base / "single" / "checkpoints" / "state.json"),
        _json(stopped / "checkpoints" / "state.json"),
    )
    assert got["d_steps"] == want["d_steps"] == 8 and got["history"] == want["history"]


# ---------------------------------------------------------------------------
# --resume with damaged files: state.npz (fallback to state.prev.npz, which alone
# counts as a checkpoint), both state files (refused), the cached classifier
# (trained again).


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_resume_falls_back_to_state_prev_and_retrains_a_damaged_classifier(uninterrupted, capsys):
    """The finished run with state.npz truncated, state.json gone and classifier.keras
    corrupted: --resume says so, one line each, restores state.prev.npz (the step
    checkpoint after D step 6), trains the classifier again and ends where the
    uninterrupted run ends."""
    base = uninterrupted
    run = base / "damaged"
    shutil.copytree(base / "single", run)
    ckpt = run / "checkpoints"
    _truncate(ckpt / "state.npz")
    (ckpt / "state.json").unlink()
    data = (run / "classifier.keras").read_bytes()
    middle = len(data) // 2
    (run / "classifier.keras").write_bytes(
        data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]
    )
    capsys.readouterr()
    assert _main(["sagan", "--out", str(run), "--resume", "--checkpoint-every", "3"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "falling back" in line] == [
        f"checkpoint {ckpt / 'state.npz'} cannot be read (File is not a zip file); falling back to state.prev.npz"
    ]
    assert [line for line in err if "again" in line] == [
        f"{run / 'classifier.keras'} fails its SHA-256 checksum (damaged); training the evaluation classifier again"
    ]
    assert "resuming" in "\n".join(err) and "at epoch 1, batch 2 of 2" in "\n".join(err)
    _assert_equals_single(base, ckpt / "state.npz", "single/checkpoints/state.npz")
    want, got = _json(base / "single" / "checkpoints" / "state.json"), _json(ckpt / "state.json")
    assert got["d_steps"] == want["d_steps"] == 8
    # The classifier trained again from the same data and seed measures the same FIDs.
    assert got["history"] == want["history"] and got["initial_fid"] == want["initial_fid"]
    from train import checkpoint

    assert (
        checkpoint.check_file(str(run / "classifier.keras"))[0] is not None
    )  # written again, checked


def test_resume_with_no_good_state_is_refused_in_one_line(uninterrupted, capsys):
    base = uninterrupted
    run = base / "both_damaged"
    shutil.copytree(base / "single", run)
    ckpt = run / "checkpoints"
    for name in ("state.npz", "state.prev.npz"):
        _truncate(ckpt / name)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    capsys.readouterr()
    assert _main(["sagan", "--out", str(run), "--resume"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        f"error: checkpoint {ckpt / 'state.npz'} cannot be read (File is not a zip file); "
        f"no earlier checkpoint to fall back to"
    ], err
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
