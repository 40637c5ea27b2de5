"""The one training loop of `python -m train`: `fit` drives every model through the small
step interface `Step` (docs/architecture.md, "The training engine"; what it guarantees on
any number of replicas and workers: docs/distributed.md, "What the loop guarantees").

What those pages leave out:
- Batches of epoch e are the caller's `source(e)`, built on a background thread while
  the step runs; a mid-epoch checkpoint records the batches done and the epoch's running
  log sums, so a resumed epoch ends with the uninterrupted run's logs.
- The time budget (`--max-minutes`) counts the training steps, not the epoch-end
  evaluation, on one clock: the budget fraction the chief has used, agreed by every
  worker after every step (train.preemption), which also gives the learning-rate decays
  their progress (`At.progress`: SAGAN's, and `warmup_cosine`).
- The best epoch's weights (by `Plan.best`, evaluated on the averaged weights) are a
  `best` checkpoint, restored into the model when training ends; with
  `Plan.average_last` K, each epoch end's are an `epoch` checkpoint (the last K kept),
  and the mean of the last K replaces the best epoch's where `Plan.best` ranks it as high.
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
import typing

import keras
import numpy as np

from train import checkpoint, preemption
from train.strategy import RunContext
from zoo.cli import UsageError


class NonFiniteLoss(UsageError):
    """The loss became NaN or Inf; nothing was saved after the last good checkpoint."""


class At(typing.NamedTuple):
    """Where a training step runs: `step` steps done before it (the whole run's), and
    `progress`, the fraction of the budget done (steps of the planned epochs or time of
    the time budget, whichever is further)."""

    step: int
    progress: float


class Step:
    """What `fit` drives. A model's step holds its models, optimizers and metrics."""

    models = ()  # the models whose configurations checkpoints are bound to
    optional = ()  # checkpoint groups that may be absent on either side

    def build(self, batch):
        """Creates every variable (before a checkpoint is restored into them)."""

    def train(self, batch, at):
        """One step on a global batch at `At`. Returns {name: (value, weight)}: the
        epoch's log of each name is the weighted mean of its values."""
        raise NotImplementedError

    def evaluate(self, batches):
        """Logs on held-out `batches` (the validation data of `Plan`)."""
        return {}

    def reset_metrics(self):
        """Called as each epoch begins."""

    def metric_results(self):
        """Stateful metrics of the epoch so far, added to its logs."""
        return {}

    def variables(self):
        """{group: variables} of a step checkpoint (all the training state)."""
        raise NotImplementedError

    def refs(self):
        """{optimizer group: the variables it updates} (checkpoint keys name them)."""
        return {}

    def best_variables(self):
        """{group: variables} kept as the `best` checkpoint (read in `averaged()`)."""
        return {}

    def averaged(self):
        """A context in which the models hold the weights evaluated and kept as best."""
        return contextlib.nullcontext()


@dataclasses.dataclass
class Plan:
    """How `fit` trains, and what it writes."""

    epochs: int
    steps_per_epoch: typing.Optional[int] = None  # None: one pass over source(epoch)
    max_minutes: float = 0.0  # time of the training steps (0: no limit)
    checkpoint_dir: typing.Optional[str] = None  # None: no checkpoints, no resume
    checkpoint_every: int = 0  # also every N steps within an epoch
    log_dir: typing.Optional[str] = None  # TensorBoard
    verbose: object = "auto"  # auto: a bar on a terminal, else a line per epoch
    validation: object = None  # batches evaluated at each epoch end (as val_*)
    best: typing.Optional[typing.Callable] = None  # logs -> sort key (lower wins) or None
    hooks: tuple = ()  # hook(epoch, logs) at each epoch end, before best and checkpoint
    # K > 1: the models end with the mean of the last K epoch ends' weights where it
    # scores at least as `best` keeps the best epoch (needs validation, best, checkpoints).
    average_last: int = 1
    # The command's train.strategy.RunContext (workers, signals); library use: one device.
    context: RunContext = dataclasses.field(default_factory=RunContext)


class EpochData:
    """The global batches of epoch e, optionally skipping the first `skip` of them.

    `source(epoch) -> sized iterable of batches` (a new shuffle per epoch, from the seed
    and the epoch only). With `steps_per_epoch`, epochs are windows of that many batches
    over the endless concatenation source(0), source(1), ...
    """

    def __init__(self, source, steps_per_epoch=None):
        self.source = source if callable(source) else (lambda epoch: source)
        self.steps_per_epoch = steps_per_epoch
        self._pass_len = None

    def steps(self):
        if self.steps_per_epoch:
            return self.steps_per_epoch
        return len(self.source(0))

    def batches(self, epoch, skip=0):
        if not self.steps_per_epoch:
            yield from itertools.islice(self.source(epoch), skip, None)
            return
        if self._pass_len is None:
            self._pass_len = max(1, len(self.source(0)))
        index, end = epoch * self.steps_per_epoch + skip, (epoch + 1) * self.steps_per_epoch
        while index < end:
            p, offset = divmod(index, self._pass_len)
            for batch in itertools.islice(self.source(p), offset, None):
                yield batch
                index += 1
                if index >= end:
                    return


def _prefetched(iterator, size=2):
    """Builds the next `size` batches on a background thread while the step runs."""
    done = object()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="zoo-batches")
    ahead = collections.deque(pool.submit(next, iterator, done) for _ in range(size))
    try:
        while (item := ahead.popleft().result()) is not done:
            ahead.append(pool.submit(next, iterator, done))
            yield item
    finally:
        # The consumer stopped early (time limit, NaN): build nothing more.
        pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def _restoring(variables):
    """Puts `variables` back to their current values when the block ends."""
    saved = [v.numpy() for v in variables]
    try:
        yield
    finally:
        for variable, value in zip(variables, saved):
            variable.assign(value)


@contextlib.contextmanager
def averaged_weights(model):
    """Context in which the model holds its optimizer's moving averages of the weights
    (`use_ema=True`) instead of the raw weights, which come back on exit. Evaluation
    and the best weights see the averages; training and its checkpoints keep the raw
    weights, so a resumed run continues exactly. A no-op without `use_ema`."""
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not (getattr(inner, "use_ema", False) and inner.built):
        yield
        return
    variables = model.trainable_variables
    with _restoring(variables):
        inner.finalize_variable_values(variables)
        yield


def warmup_cosine(peak, warmup_steps, total_steps, alpha=0.0):
    """The learning rate at `At` (a `Step`'s `rate`): a linear warm-up from 0 to `peak`
    over `warmup_steps`, then half a cosine down to `alpha * peak` at progress 1 (Keras's
    `CosineDecay` with its step replaced by `At.progress` of `total_steps`). Progress is
    the budget's: under --max-minutes the decay ends where the clock stops training, on
    the clock every worker agrees on; without one, this is `CosineDecay` to the step."""

    def rate(at):
        if at.step < warmup_steps:
            return peak * at.step / warmup_steps
        done = (at.progress * total_steps - warmup_steps) / max(1, total_steps - warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, done))))
        return peak * ((1.0 - alpha) * cosine + alpha)

    return rate


def set_learning_rates(optimizers, factor):
    """Sets `factor` times each base rate ((optimizer, base) pairs) into its optimizer's
    learning-rate variable: both backends' compiled steps read it, checkpoints keep it."""
    for optimizer, base in optimizers:
        getattr(optimizer, "inner_optimizer", optimizer).learning_rate.assign(base * factor)


def _numbers(logs):
    return {
        k: float(v)
        for k, v in logs.items()
        if isinstance(v, (int, float, np.floating)) and not isinstance(v, bool)
    }


class _Training:
    """One `fit`: the epochs from the restored position, the stop checks after each step
    and the epoch ends (see the module docstring)."""

    def __init__(self, step, data, plan, state):
        self.step, self.data, self.plan, self.state = step, data, plan, state
        self.steps = data.steps()
        self.context, self.signals = plan.context, plan.context.signals
        self.chief = self.context.is_chief()
        self.limit = (plan.max_minutes or 0.0) * 60.0
        self.sums = {}  # name -> [weighted sum, weight] of the epoch so far
        self.seconds = state["train_seconds"]  # this worker's clock of the training steps
        # The fraction of the time budget used, on the chief's clock and budget (agreed).
        self.used = self.seconds / self.limit if self.limit else 0.0
        self.stopped_by_time = False
        verbose = plan.verbose
        if verbose in (None, "auto"):  # a bar on a terminal, else a line per epoch
            verbose = 1 if sys.stdout.isatty() else 2
        self.bar = keras.callbacks.CallbackList(
            add_history=False,
            add_progbar=int(verbose) != 0,
            verbose=int(verbose),
            epochs=plan.epochs,
            steps=self.steps,
        )
        self.board = None  # TensorBoard's writer, made at the first epoch end
        # Several workers agree on the step to stop after and on the clock; one worker
        # polls its own signal flag and clock.
        index, workers = self.context.worker()
        self.cluster = preemption.ClusterStop(self.signals, index, workers) if workers > 1 else None

    # ------------------------------------------------------------ checkpoints
    def save(self, epoch, done):
        if not (self.plan.checkpoint_dir and self.chief):
            return
        checkpoint.save(
            self.plan.checkpoint_dir,
            self.step.variables(),
            {
                "step": self.state["step"],
                "epoch": epoch,
                "batches_done": done,
                "partial": self.sums,
                "state": self.state,
            },
            refs=self.step.refs(),
            models=self.step.models,
        )

    def written(self):
        """What a stop wrote, for its one line (several workers stop at the same step:
        the chief wrote it)."""
        directory = self.plan.checkpoint_dir
        if not directory:
            return "no checkpoint directory, nothing written"
        if not self.chief:
            return "the chief wrote the checkpoint"
        return f"wrote {checkpoint.path_for(directory, self.state['step'])}"

    # ------------------------------------------------------------ steps
    def progress(self):
        return max(self.state["step"] / max(1, self.steps * self.plan.epochs), self.used)

    def _check_finite(self, logs, epoch):
        for name, (value, _) in logs.items():
            if not math.isfinite(value):
                kept = self.plan.checkpoint_dir and checkpoint.latest(self.plan.checkpoint_dir)[0]
                where = (
                    f"kept the last good checkpoint {kept}" if kept else "no checkpoint was written"
                )
                raise NonFiniteLoss(
                    f"training stopped: the {name} became {value} at epoch {epoch + 1}, step "
                    f"{self.state['step']}; {where} (lower the learning rate, or check the data)"
                )

    def logs(self):
        means = {k: s / w for k, (s, w) in self.sums.items() if w}
        return {**means, **self.step.metric_results()}

    def epoch(self, epoch, skip):
        """Trains epoch `epoch` from batch `skip`; returns the batches done in it."""
        self.step.reset_metrics()
        self.bar.on_epoch_begin(epoch)
        base, started, done = self.seconds, time.perf_counter(), skip
        every = self.plan.checkpoint_every
        for batch in _prefetched(self.data.batches(epoch, skip)):
            logs = self.step.train(batch, At(self.state["step"], self.progress()))
            self.state["step"] += 1
            step, done = self.state["step"], done + 1
            self._check_finite(logs, epoch)
            for name, (value, weight) in logs.items():
                total = self.sums.setdefault(name, [0.0, 0.0])
                total[0] += value * weight
                total[1] += weight
            self.seconds = base + time.perf_counter() - started
            self.used = self.seconds / self.limit if self.limit else 0.0
            if self.cluster:
                self.used = self.cluster.clock(step, self.used)
            self.bar.on_train_batch_end(done - 1, self.logs())
            if every and step % every == 0 and done < self.steps:
                self.save(epoch, done)
            # A signal: this process's, or (several workers) a peer's.
            if self.cluster.poll(step) if self.cluster else self.signals.requested is not None:
                # The step is finished: save it (within the epoch, so that the resumed run
                # still closes the epoch), then leave with the signal's exit code.
                self.state["train_seconds"] = self.seconds
                self.save(epoch, done)
                self.signals.stop(f"{self.written()} at epoch {epoch + 1}, batch {done}")
            if self.used >= 1.0:
                self.stopped_by_time = True
                break
        return done

    def end_epoch(self, epoch, done):
        """Validation, the hooks, history, the best weights, TensorBoard and the
        checkpoint of the epoch's end (an epoch the time limit ended is closed too)."""
        plan, state = self.plan, self.state
        state["train_seconds"] = self.seconds
        logs = self.logs()
        if plan.validation is not None:
            with self.step.averaged():
                logs.update({f"val_{k}": v for k, v in self.step.evaluate(plan.validation).items()})
        for hook in plan.hooks:
            hook(epoch, logs)
        entry = {"epoch": epoch + 1, "steps": done, **_numbers(logs)}
        state["history"].append({k: round(v, 5) for k, v in entry.items()})
        state["epoch"] = epoch + 1
        key = plan.best(logs) if plan.best and plan.checkpoint_dir else None
        kept = []  # (name, record, keep) of the weights `averaged()` holds
        if key is not None and (state.get("best") is None or list(key) < state["best"]["key"]):
            best = {"epoch": epoch + 1, "step": state["step"], "key": list(key), "logs": entry}
            state["best"] = best
            kept.append(("best", best, 2))
        if key is not None and plan.average_last > 1:  # the weights a final average takes
            kept.append(("epoch", {"epoch": epoch + 1, "step": state["step"]}, plan.average_last))
        if kept:  # one swap to the averaged weights for every file that holds them
            with self.step.averaged():
                variables, models = self.step.best_variables(), self.step.models
                for name, record, keep in kept:
                    checkpoint.save(
                        plan.checkpoint_dir, variables, record, name=name, keep=keep, models=models
                    )
        self.bar.on_epoch_end(epoch, {k: v for k, v in logs.items() if v is not None})
        if plan.log_dir:  # TensorBoard: every epoch's numeric logs as scalars
            import tensorflow as tf

            self.board = self.board or tf.summary.create_file_writer(plan.log_dir)
            with self.board.as_default(step=epoch + 1):
                for key, value in _numbers(logs).items():
                    tf.summary.scalar(key, value)
            self.board.flush()
        self.sums = {}
        self.save(epoch + 1, 0)

    def run(self, epoch, skip):
        self.bar.on_train_begin()
        with self.signals.listening():
            try:
                while epoch < self.plan.epochs:
                    if self.used >= 1.0:
                        self.stopped_by_time = True
                        break
                    done = self.epoch(epoch, skip)
                    self.end_epoch(epoch, done)
                    if self.cluster is None and self.signals.requested is not None:
                        self.signals.stop(f"{self.written()} at the end of epoch {epoch + 1}")
                    epoch, skip = epoch + 1, 0
                if self.cluster and self.cluster.finish():  # a signal after the last step
                    self.signals.stop(f"{self.written()} at the end of epoch {epoch}")
            finally:
                if self.cluster:
                    self.cluster.close()
                self.bar.on_train_end()


def _fallback_line(damaged, path):
    for _, reason in damaged:
        print(f"{reason}; falling back to {os.path.basename(path)}", file=sys.stderr)


def _restore(step, plan, state):
    """Restores the newest good step checkpoint into `step` and `state`: (epoch, batches
    done, the epoch's log sums, the file's name), or (0, 0, {}, None) when there is none.
    Checks that the best checkpoint the state names can be read (else the previous best,
    saying so)."""
    directory = plan.checkpoint_dir
    if not directory or not checkpoint.list_checkpoints(directory):
        return 0, 0, {}, None
    path, record, damaged = checkpoint.latest(directory)
    if path is None:
        raise checkpoint.DamagedCheckpoint(
            f"{damaged[0][1]}; no earlier checkpoint to fall back to"
        )
    checkpoint.restore(
        path, step.variables(), refs=step.refs(), models=step.models, optional=step.optional
    )
    _fallback_line(damaged, path)
    state.clear()
    state.update(record["state"])
    if state.get("best") is not None:
        best, best_record, damaged = checkpoint.latest(
            directory, "best", accept=lambda r: r["step"] <= state["step"]
        )
        if best is None:
            reason = damaged[0][1] if damaged else f"the best checkpoint of {directory} is missing"
            raise checkpoint.DamagedCheckpoint(f"{reason}; no earlier good copy to fall back to")
        _fallback_line(damaged, best)
        state["best"] = best_record
    return record["epoch"], record["batches_done"], record["partial"], os.path.basename(path)


def fit(step, source, plan, state=None, name=None):
    """Trains `step` by `plan` on `source` and returns the run's state (`state`, updated
    in place: epoch, step, train_seconds, history, best, stopped_by_time_limit, and any
    keys of the caller's, which checkpoints carry too).

    source: `epoch -> sized iterable of global batches`, or one sized iterable reused
        every epoch.
    name: the run, for the line a resumed run prints ("resuming NAME at epoch ...").
    A checkpoint in `plan.checkpoint_dir` is restored first (with its state); a damaged
    newest one falls back to the previous, saying so, and none good is refused
    (`checkpoint.DamagedCheckpoint`). With `plan.best`, the best weights are restored
    into the models at the end.
    """
    data = EpochData(source, plan.steps_per_epoch)
    first = next(iter(data.batches(0)), None)
    if first is None:
        raise UsageError("no training batches")
    step.build(first)
    state = state if state is not None else {}
    for key, value in (("epoch", 0), ("step", 0), ("train_seconds", 0.0), ("history", [])):
        state.setdefault(key, value)
    epoch, skip, partial, restored = _restore(step, plan, state)
    # After the restore: a checkpoint that does not fit is the run's one line on stderr.
    plan.context.announce(getattr(step, "runtime", None))
    if restored:
        where = f"at epoch {epoch + 1}, batch {skip}" if skip else f"after epoch {epoch}"
        print(
            f"resuming {name or plan.checkpoint_dir} {where} of {plan.epochs} from {restored}",
            file=sys.stderr,
        )
    training = _Training(step, data, plan, state)
    training.sums = {k: list(v) for k, v in partial.items()}
    training.run(epoch, skip)
    state["stopped_by_time_limit"] = training.stopped_by_time
    best = state.get("best")
    if plan.best and best is not None and plan.checkpoint_dir:  # the best weights, kept
        path, _, _ = checkpoint.latest(
            plan.checkpoint_dir, "best", accept=lambda r: r["step"] == best["step"]
        )
        if path is None:
            raise checkpoint.DamagedCheckpoint(
                f"the best checkpoint of step {best['step']} cannot be read"
            )
        checkpoint.restore(path, step.best_variables(), models=step.models)
        if plan.average_last > 1:
            state["averaged"] = _average_last(step, plan, best)
    return state


def _average_last(step, plan, best):
    """Puts the mean of the last `plan.average_last` epoch ends' weights (`epoch`
    checkpoints; damaged ones are left out, saying so) into the models, which hold the
    best epoch's, and evaluates it: kept where `plan.best` ranks it at least as high as
    the best epoch, else the best epoch's weights go back. Returns {"epochs", "logs",
    "kept"}, or None with fewer than two epochs to average."""
    groups = step.best_variables()
    variables = [v for group in groups.values() for v in group]
    paths = checkpoint.list_checkpoints(plan.checkpoint_dir, "epoch")[-plan.average_last :]
    if len(paths) < plan.average_last:  # a shorter run, or a resumed one with a larger K
        print(f"{len(paths)} epoch ends kept to average, not {plan.average_last}", file=sys.stderr)
    if len(paths) < 2:
        return None
    readable, total, logs = [], None, {}
    with _restoring(variables):  # the best epoch's weights, unless the mean is kept
        for path in paths:
            try:
                record = checkpoint.restore(path, groups, models=step.models)
            except checkpoint.DamagedCheckpoint as e:
                print(f"{e}; the average leaves it out", file=sys.stderr)
                continue
            readable.append(record["epoch"])
            values = [keras.ops.convert_to_numpy(v).astype("float64") for v in variables]
            total = values if total is None else [t + v for t, v in zip(total, values)]
        if len(readable) < 2:
            return None
        mean = [(t / len(readable)).astype(v.dtype) for v, t in zip(variables, total)]
        for v, value in zip(variables, mean):
            v.assign(value)
        if plan.validation is not None:
            logs = {f"val_{k}": v for k, v in step.evaluate(plan.validation).items()}
    key = plan.best(logs)  # None where the key is a hook's log: the mean is not ranked
    kept = key is not None and list(key) <= best["key"]
    if kept:
        for v, value in zip(variables, mean):
            v.assign(value)
    return {"epochs": readable, "logs": _numbers(logs), "kept": kept}


def run_plan(context, out, train_cfg, **kwargs):
    """The `Plan` of the run directory `out`, from its options (config.json's "train")."""
    return Plan(
        epochs=train_cfg["epochs"],
        max_minutes=train_cfg["max_minutes"] or 0.0,
        verbose=train_cfg["verbose"],
        checkpoint_dir=os.path.join(out, "checkpoints"),
        checkpoint_every=context.checkpoint_every,
        log_dir=os.path.join(out, "logs"),
        context=context,
        **kwargs,
    )


def highest(key, ties=None):
    """`Plan.best` keeping the epoch with the highest log `key` (e.g. "val_acc"); among
    equals, the one with the lowest log `ties` (e.g. "val_loss"), when given."""

    def best(logs):
        if logs.get(key) is None:
            return None
        return [-float(logs[key])] + ([float(logs[ties])] if ties else [])

    return best
