"""SIGTERM and SIGINT during training: finish the step, write a checkpoint, exit.

Cloud VMs, Kubernetes and batch schedulers stop a job with SIGTERM (then SIGKILL after
a grace period); Ctrl-C sends SIGINT. `python -m train` installs `handlers()` for the
whole command. Inside a training loop (`listening()`, or `listen()` ... `listen(False)`)
a signal only sets a flag: the loop polls `requested()` after each step, writes a
checkpoint and calls `stop(...)`, and the CLI prints one line and exits with
128 + the signal number (143 for SIGTERM, 130 for SIGINT). `--resume` then continues
from that checkpoint. Outside a loop, or on a second signal, `Stopped` is raised at
once (nothing newer than the last checkpoint to save; atomic writes leave no partial
file).
"""

import contextlib
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state = {"listening": 0, "requested": None}


class Stopped(BaseException):
    """Training stopped by a signal. A BaseException, like KeyboardInterrupt, so that
    `except Exception` clean-up code does not swallow it. `code` is the exit status."""

    def __init__(self, signum, message):
        super().__init__(message)
        self.signum = signum
        self.code = 128 + int(signum)


def _name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum, frame):
    if _state["listening"] and _state["requested"] is None:
        _state["requested"] = signum
        return
    raise Stopped(signum, f"stopped by {_name(signum)}")


@contextlib.contextmanager
def handlers():
    """Installs the handlers (main thread only) and restores the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    reset()
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        reset()


def reset():
    _state.update(listening=0, requested=None)


def listen(on=True):
    """Marks the start (on) or end (off) of a loop that polls `requested()`."""
    _state["listening"] = max(0, _state["listening"] + (1 if on else -1))


@contextlib.contextmanager
def listening():
    listen(True)
    try:
        yield
    finally:
        listen(False)


def done_listening(saved):
    """Ends a `listen()` region; a signal that came after the loop's last poll (during
    its final epoch-end work, after the last checkpoint) stops the command here."""
    listen(False)
    if _state["requested"] is not None:
        stop(saved)


def requested():
    """The signal received while listening, or None (this process's own: under
    several workers a signal to one worker is not yet shared with the others)."""
    return _state["requested"]


def stop(saved):
    """Raises `Stopped` for the signal received; `saved` says what was written."""
    signum = _state["requested"] or signal.SIGTERM
    raise Stopped(signum, f"stopped by {_name(signum)}: {saved}; continue with --resume")
