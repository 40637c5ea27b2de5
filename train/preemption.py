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
_state = {"listening": 0, "requested": None, "peer": False}


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
    _state.update(listening=0, requested=None, peer=False)


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
    pending = requested()  # a collective under several workers, as in the loop
    listen(False)
    if pending is not None:
        stop(saved)


def from_peer():
    """Another worker of the run was signalled: this one stops too (SIGTERM's code)."""
    if _state["requested"] is None:
        _state["requested"] = signal.SIGTERM
        _state["peer"] = True


def requested():
    """The signal received while listening, or None.

    Under several workers (train.strategy) this is a collective that every worker
    calls at the same points of its loop: a preempted VM signals only its own worker,
    and a worker that stopped alone would leave the others waiting in their next
    collective. The workers all-reduce their flags; a worker stops for a peer's
    signal too (`from_peer`)."""
    from train import strategy as dist

    if _state["listening"] and dist.worker()[1] > 1:
        import tensorflow as tf

        strategy = dist.get()
        local = 0.0 if _state["requested"] is None else 1.0
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(local)), axis=None)
        if float(total) > 0:
            from_peer()
    return _state["requested"]


def stop(saved):
    """Raises `Stopped` for the signal received; `saved` says what was written."""
    signum = _state["requested"] or signal.SIGTERM
    how = f"{_name(signum)} on another worker" if _state["peer"] else _name(signum)
    raise Stopped(signum, f"stopped by {how}: {saved}; continue with --resume")
