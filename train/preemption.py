"""SIGTERM and SIGINT during training: finish the step, write a checkpoint, exit.

Cloud VMs, Kubernetes and batch schedulers stop a job with SIGTERM (then SIGKILL after
a grace period); Ctrl-C sends SIGINT. `python -m train` installs `handlers()` for the
whole command, which write into its `Signals`. Inside a training loop (`listening()`) a
signal only sets `requested`: the loop polls it after each step, writes a checkpoint and
calls `stop(...)`, and the CLI prints one line and exits with 128 + the signal number
(143 for SIGTERM, 130 for SIGINT). `--resume` then continues from that checkpoint.
Outside a loop, or on a second signal, `Stopped` is raised at once (nothing newer than
the last checkpoint to save; atomic writes leave no partial file).

Several workers (`MultiWorkerMirroredStrategy`): a preempted VM signals its own worker
only, and a worker that stopped alone would leave the others waiting in their next
collective. `ClusterStop` makes them all stop after the same step, as TensorFlow's
`tf.distribute.experimental.PreemptionCheckpointHandler` does, over the same channel:
the coordination service's key-value store, not a collective (an extra collective per
step met the training step's gradient all-reduce on the other worker under load). The
signalled worker, at its next poll after step N, publishes "stop after step N+1" and
waits until every worker's watcher thread has acknowledged it; then it runs step N+1.
No worker can finish step N+2 without it, so each one reads the target at its poll
after step N+1 at the latest, and all stop there. At the end of the loop the workers
exchange their flags once more (a signal after the last poll).

The clock of the training steps (time budget, SAGAN's learning-rate decay) is agreed
the same way: after each step the chief publishes its clock, and every other worker
reads it (`clock`), so all decide the same at the same step.
"""

import contextlib
import itertools
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """Training stopped by a signal. A BaseException, like KeyboardInterrupt, so that
    `except Exception` clean-up code does not swallow it. `code` is the exit status."""

    def __init__(self, signum, message):
        super().__init__(message)
        self.code = 128 + int(signum)


class Signals:
    """One command's signal state, written by the handlers `handlers()` installs: the
    signal received while a loop listens (`requested`, None until then), whether it was
    a peer's (`peer`), and the numbering of the command's `ClusterStop`s. A `Signals()`
    of its own (no handlers) never hears one: library use."""

    def __init__(self):
        self.loops, self.requested, self.peer, self.installed = 0, None, False, False
        self.sessions = itertools.count()

    def handle(self, signum, _frame):
        if self.loops and self.requested is None:
            self.requested = signum
            return
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name}")

    @contextlib.contextmanager
    def listening(self):
        """The block of a loop that polls `requested`."""
        if self.installed and threading.current_thread() is threading.main_thread():
            # Ours again: TensorFlow's runtime for several workers (started after
            # `handlers()` by the strategy) puts its own C++ SIGTERM handler in place,
            # which swallows the signal (seen: a SIGTERM to a worker of `python -m train
            # --strategy multi_worker` left both workers training to the end).
            for s in SIGNALS:
                signal.signal(s, self.handle)
        self.loops += 1
        try:
            yield
        finally:
            self.loops = max(0, self.loops - 1)

    def from_peer(self, signum):
        """Another worker of the run was signalled: this one stops for it too."""
        if self.requested is None:
            self.requested, self.peer = int(signum), True

    def stop(self, saved):
        """Raises `Stopped` for the signal received; `saved` says what was written."""
        signum = self.requested or signal.SIGTERM
        how = signal.Signals(signum).name + (" on another worker" if self.peer else "")
        raise Stopped(signum, f"stopped by {how}: {saved}; continue with --resume")


@contextlib.contextmanager
def handlers():
    """The `Signals` of a command, with its handlers installed (main thread only) and
    the previous ones restored on exit."""
    signals = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {s: signal.signal(s, signals.handle) for s in SIGNALS}
    signals.installed = True
    try:
        yield signals
    finally:
        signals.installed = False
        for s, old in previous.items():
            signal.signal(s, old)


class ClusterStop:
    """The workers' agreement on the step to stop after (see the module docstring).

    Every worker creates one per training loop (the same number of loops on each: keys
    are numbered per command, by its `Signals`), calls `poll(step)` after each step with
    the same step numbers, `finish()` after the loop, and `close()` at the end. `poll`
    and `finish` return True when this worker must stop now (its own signal or a peer's)."""

    ACK_TIMEOUT_MS = 120_000

    def __init__(self, signals, index, workers):
        from tensorflow.python.eager import context

        self.ctx, self.index, self.workers = context.context(), int(index), int(workers)
        self.signals = signals
        self.prefix = f"attention_zoo/stop/{next(signals.sessions)}"
        self.target = None  # (step, signum) published by the signalled worker
        self.claimed = False
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, daemon=True, name=f"zoo-stop-watcher-{self.index}"
        )
        self._thread.start()

    def _watch(self):
        while self.target is None and not self._closing.is_set():
            started = time.monotonic()
            try:
                value = self.ctx.get_config_key_value(f"{self.prefix}/target", 250)
            except Exception:  # noqa: BLE001  (not set yet: DeadlineExceeded; look again)
                if time.monotonic() - started < 0.1:  # an error, not the timeout: no busy loop
                    time.sleep(0.1)
                continue
            step, signum = (int(v) for v in value.split(":"))
            self.target = (step, signum)
            try:
                self.ctx.set_config_key_value(f"{self.prefix}/target_ack/{self.index}", "1")
            except Exception as e:  # noqa: BLE001
                print(
                    f"warning: cannot acknowledge the stop to the other workers: {e}",
                    file=sys.stderr,
                )

    def clock(self, step, seconds):
        """The chief's clock (`seconds`: any float) after `step`, on every worker (the
        chief publishes it, the others wait for it: they would wait for the chief in the
        next step anyway)."""
        key = f"{self.prefix}/clock/{step}"
        if self.index == 0:
            self.ctx.set_config_key_value(key, repr(float(seconds)))
            if step > 1:  # every worker read it before the step the chief just finished
                self.ctx.delete_config_key_value(f"{self.prefix}/clock/{step - 1}")
            return seconds
        return float(self.ctx.get_config_key_value(key, self.ACK_TIMEOUT_MS))

    def _claim(self, step, signum):
        """Publishes 'stop after step+1' and waits for every worker's acknowledgement.
        Claimed once published, or once another worker's claim is there; any other
        failure is said and tried again at the next step."""
        try:
            self.ctx.set_config_key_value(self.prefix + "/target", f"{step + 1}:{int(signum)}")
        except Exception as e:  # noqa: BLE001
            if "exist" not in str(e).lower() and "AlreadyExists" not in type(e).__name__:
                print(
                    f"warning: cannot tell the other workers to stop ({e}); trying again",
                    file=sys.stderr,
                )
                return
            self.claimed = True  # another worker claimed first: the watcher reads its target
            return
        self.claimed = True
        self.target = self.target or (step + 1, int(signum))
        with contextlib.suppress(Exception):  # a worker that does not answer is gone: stop
            for i in range(self.workers):
                self.ctx.get_config_key_value(f"{self.prefix}/target_ack/{i}", self.ACK_TIMEOUT_MS)

    def _own(self):
        return self.signals.requested if not self.signals.peer else None

    def poll(self, step):
        own = self._own()
        if own is not None and not self.claimed and self.target is None:
            self._claim(step, own)
        if self.target is not None and step >= self.target[0]:
            self.signals.from_peer(self.target[1])
            return True
        return False

    def finish(self):
        """After the loop: every worker's own signal (or the target) is exchanged once
        more, so that a signal after the last poll stops every worker."""
        own = self._own() or (self.target[1] if self.target is not None else 0)
        self.ctx.set_config_key_value(f"{self.prefix}/end/{self.index}", str(int(own)))
        signums = [
            int(self.ctx.get_config_key_value(f"{self.prefix}/end/{i}", self.ACK_TIMEOUT_MS))
            for i in range(self.workers)
        ]
        first = next((s for s in signums if s), 0)
        if first:
            self.signals.from_peer(first)
        return bool(first)

    def close(self):
        self._closing.set()
        self._thread.join(timeout=2.0)
