"""One writer per run directory: a second train or export into the same --out refuses
with one line naming the holder's PID (exit 2); a lock left by a dead process is taken
over; the lock file goes away with its holder's command."""

import functools
import os
import signal
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

HOLD = (
    "import sys, time; sys.path.insert(0, {root!r}); from zoo import run_lock; "
    "run_lock.acquire({path!r}); print('held', flush=True); time.sleep(120)"
)


@pytest.fixture
def holder(tmp_path):
    """A live process holding tmp_path/run's lock (zoo.run_lock)."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(root=ROOT, path=str(run))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    yield run, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _cli(*argv):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _one_line(proc, needle):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in lines[0], lines[0]


@pytest.mark.slow
def test_a_second_training_run_refuses_naming_the_holders_pid(holder):
    run, proc = holder
    before = sorted(os.listdir(run))
    _one_line(_cli("-m", "train", "tagger", "--out", str(run)), f"in use by process {proc.pid}")
    _one_line(_cli("-m", "train", "seq2seq", "--out", str(run)), f"in use by process {proc.pid}")
    assert sorted(os.listdir(run)) == before == [".zoo-lock"]
    # The holder goes (SIGKILL: no clean-up): its lock file stays, naming a dead PID ...
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run / ".zoo-lock").read_text().strip() == str(proc.pid)
    # ... and is taken over: this run gets past the lock to its data check, then releases it.
    missing = run.parent / "missing.conllu"
    _one_line(
        _cli("-m", "train", "tagger", "--out", str(run), "--train-file", str(missing)), str(missing)
    )
    result = _cli(
        "-m",
        "train",
        "tagger",
        "--out",
        str(run),
        "--train-file",
        os.path.join(ROOT, "tests", "fixtures", "tagger", "empty.conllu"),
    )
    _one_line(result, "empty.conllu")
    assert os.listdir(run) == []  # the stale lock was taken over, then released with the command


@pytest.mark.slow
def test_an_export_into_a_locked_directory_refuses(holder, tmp_path, capsys):
    from export.__main__ import main
    from tests.support.runs import make_tagger_run

    run, proc = holder
    source = tmp_path / "tagger_run"
    make_tagger_run(str(source))
    for argv in (
        ["savedmodel", str(source), "--out", str(run)],
        ["tflite", str(source), "--out", str(run / "t.tflite")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by process {proc.pid}" in err[0], err
    assert sorted(os.listdir(run)) == [".zoo-lock"]


def test_train_holds_its_run_directory_and_releases_it(tmp_path):
    from train import rundir
    from zoo import run_lock as runlock

    out = tmp_path / "run"
    rundir.create_run_dir(str(out), "tagger")
    try:
        assert runlock.holder(str(out)) == os.getpid()
        assert (out / ".zoo-lock").read_text().strip() == str(os.getpid())
        # Another process sees the lock (flock, not the file's mere presence).
        probe = _cli(
            "-c",
            f"import sys; sys.path.insert(0, {ROOT!r}); from zoo import run_lock as runlock; "
            f"print(runlock.holder({str(out)!r}))",
        )
        assert probe.stdout.strip() == str(os.getpid()), probe.stderr
    finally:
        runlock.release_all()
    assert not (out / ".zoo-lock").exists() and runlock.holder(str(out)) is None


@pytest.mark.slow
def test_train_and_export_use_the_one_lock_module():
    """zoo/run_lock.py is the one lock module: train's and export's fast paths import
    it, and themselves, without Keras or TensorFlow."""
    probe = _cli(
        "-c",
        f"import sys; sys.path.insert(0, {ROOT!r}); import train.cli, train.rundir; "
        f"import export.savedmodel, export.tflite; import zoo.run_lock as z; "
        f"print(train.rundir.runlock is z, export.savedmodel.runlock is z, "
        f"export.tflite.runlock is z, sorted({{'keras', 'tensorflow'}} & set(sys.modules)))",
    )
    assert probe.stdout.split() == ["True", "True", "True", "[]"], probe.stderr


@pytest.mark.slow
def test_one_writable_ancestor_check_keeps_each_cli_s_message(tmp_path, monkeypatch):
    """train, export and the zoo CLIs share zoo.run_lock.check_writable_ancestor; their
    messages are unchanged (os.access patched: root writes anywhere)."""
    from train import rundir
    from zoo import run_lock
    from zoo.cli import UsageError

    (tmp_path / "file").write_text("x")
    target = str(tmp_path / "file" / "out")
    train_out = functools.partial(rundir.check_out_dir, resume=False, kinds=())  # --out
    for check in (train_out, lambda p: run_lock.check_writable_ancestor(p, "--out")):
        with pytest.raises(
            UsageError, match=f"^--out {target}: {tmp_path / 'file'} is not a directory$"
        ):
            check(target)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    target = str(tmp_path / "new" / "out")
    with pytest.raises(
        UsageError, match=f"^--out {target}: cannot create it, {tmp_path} is not writable$"
    ):
        train_out(target)
    with pytest.raises(UsageError, match=f"^--out {target}: {tmp_path} is not writable$"):
        run_lock.check_writable_ancestor(target, "--out")
