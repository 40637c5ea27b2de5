"""The one training loop of `python -m train`: a custom loop on `tf.distribute` that runs
unchanged under every strategy (one device, mirrored GPUs, several workers, TPU), and,
under Keras's JAX backend, the same loop around a jitted stateless step
(`train.jax_engine.JaxEngine`, `keras.distribution.DataParallel` for several devices).

Keras 3's `fit` fails under `MultiWorkerMirroredStrategy` (keras-team/keras#20585), so
`fit` here replaces `model.fit` for compiled models, keeping what the run code relies on:
Keras callbacks (progress bar, TensorBoard, the run's checkpoint and time-limit
callbacks, `model.stop_training`), `validation_data`, `initial_epoch`, `steps_per_epoch`,
and the compiled loss, optimizer and metrics.

What it does differently, on purpose:
- Every global batch (the data code's batch, `--batch-size` rows) is split row-wise
  across all replicas of all workers; each worker builds the same global batches from
  the same seed and feeds its replicas their slices (explicit sharding).
- The loss is the SUM of per-example (per-token) losses divided by the GLOBAL count
  of real examples (padding has weight 0 and does not count), so replicas' gradients
  add up to the single-device gradient whatever the number of replicas.
- Metrics are Keras metrics updated on each replica; their variables sum across replicas.
- Batch order of epoch e depends only on (seed, e), so a run resumed from a mid-epoch
  checkpoint sees exactly the batches the uninterrupted run would have seen.
- Checkpoints (train.checkpoint) every `--checkpoint-every` steps and at each epoch end,
  written by the chief only, atomically. A non-finite loss stops the run before
  anything else is written (`NonFiniteLoss`); the last good checkpoint stays.
- `--mixed-precision` with float16 scales the loss (`keras.optimizers.LossScaleOptimizer`,
  which `compile` installs); `--jit-compile` XLA-compiles the forward and backward pass.
"""

import contextlib
import math
import os
import sys
import time

import keras
import numpy as np

from train import checkpoint, preemption
from train import strategy as dist
from train.engine_base import EngineBase, host_numpy
from train.loss_terms import host_count, unpack
from zoo.cli import UsageError


class NonFiniteLoss(UsageError):
    """The loss became NaN or Inf; nothing was saved after the last good checkpoint."""


def _rows(batch):
    return int(keras.tree.flatten(batch)[0].shape[0])


def _split(strategy, batch):
    """Per-replica slices of a global batch: replica r of R gets rows [r*B/R, (r+1)*B/R)."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return batch
    total = _rows(batch)
    bounds = [round(r * total / replicas) for r in range(replicas + 1)]

    def value_fn(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.nest.map_structure(lambda a: tf.constant(a[bounds[r] : bounds[r + 1]]), batch)

    return strategy.experimental_distribute_values_from_function(value_fn)


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
            for i, batch in enumerate(self.source(epoch)):
                if i >= skip:
                    yield batch
            return
        if self._pass_len is None:
            self._pass_len = max(1, len(self.source(0)))
        start = epoch * self.steps_per_epoch + skip
        end = (epoch + 1) * self.steps_per_epoch
        index = start
        while index < end:
            p, offset = divmod(index, self._pass_len)
            for i, batch in enumerate(self.source(p)):
                if i < offset:
                    continue
                yield batch
                index += 1
                if index >= end:
                    return


def _prefetched(iterator, size=2):
    """Builds the next batches on a background thread while the step runs."""
    import queue
    import threading

    q = queue.Queue(maxsize=size)
    done = object()
    stop = threading.Event()

    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            for item in iterator:
                if not put(item):
                    return
        except BaseException as e:  # noqa: BLE001  (re-raised in the consumer)
            put(e)
        put(done)

    threading.Thread(target=work, daemon=True).start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (time limit, NaN): let the producer end


def _reduce_before_clipping(optimizer):
    """Keras's TF optimizer clips (clipnorm, global_clipnorm) and decays each replica's
    LOCAL gradient and only then sums gradients across replicas, so a clipped run on
    R replicas differs from one device. The engine sums first (in the replica step) and
    turns the optimizer's own summation off, so clipping sees the global gradient."""
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if opt is not None and hasattr(opt, "_all_reduce_sum_gradients"):
            opt._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)


# ------------------------------------------------------------------ the loop
class Engine(EngineBase):
    def __init__(self, model, loss_terms=None, jit_compile=None, strategy=None, terms_kind=None):
        super().__init__(model, loss_terms, terms_kind)
        self.strategy = strategy or dist.get()
        self.jit_compile = dist.jit_compile() if jit_compile is None else bool(jit_compile)

    def build(self, batch):
        """Creates every variable (model, compiled metrics, optimizer slots) under the
        strategy's scope, before any step runs in a replica context."""
        x, y, w = unpack(host_numpy(batch))
        sample = keras.tree.map_structure(lambda a: a[:1], (x, y) if w is None else (x, y, w))
        with self.strategy.scope():
            self.model._symbolic_build(data_batch=sample)
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)

    def _make_train_fn(self):
        import tensorflow as tf

        model, optimizer, terms = self.model, self.optimizer, self.terms
        replicas = self.strategy.num_replicas_in_sync
        metrics = self._metrics()

        def forward_backward(x, y, w, global_count):
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss_sum, _ = terms(y, y_pred, w)
                loss = loss_sum / global_count
                if model.losses:
                    loss = loss + tf.cast(tf.add_n(model.losses), tf.float32) / replicas
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            return loss, grads, y_pred

        compiled = tf.function(
            forward_backward, jit_compile=self.jit_compile, reduce_retracing=True
        )

        if replicas > 1:
            _reduce_before_clipping(optimizer)

        def replica_step(x, y, w, global_count):
            loss, grads, y_pred = compiled(x, y, w, global_count)
            if replicas > 1:
                grads = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, grads
                )
            optimizer.apply(grads, model.trainable_variables)
            for m in metrics:
                m.update_state(y, y_pred, w)
            return loss

        def train_fn(x, y, w, global_count):
            per_replica = self.strategy.run(replica_step, args=(x, y, w, global_count))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return train_fn

    def _make_eval_fn(self):
        import tensorflow as tf

        model, terms = self.model, self.terms
        metrics = self._metrics()

        def replica_step(x, y, w, global_count):
            y_pred = model(x, training=False)
            loss_sum, _ = terms(y, y_pred, w)
            for m in metrics:
                m.update_state(y, y_pred, w)
            return loss_sum / global_count

        def eval_fn(x, y, w, global_count):
            per_replica = self.strategy.run(replica_step, args=(x, y, w, global_count))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return eval_fn

    def _graph(self, fn, x, y, w):
        """One trace for every batch shape on one replica (dynamic dimensions; XLA still
        compiles per shape); several replicas: traces generalised after the first shapes."""
        import tensorflow as tf

        if self.strategy.num_replicas_in_sync > 1:
            return tf.function(fn, reduce_retracing=True)

        def spec(a):
            return tf.TensorSpec([None] * np.ndim(a), tf.as_dtype(np.asarray(a).dtype))

        xs, ys = tf.nest.map_structure(spec, x), tf.nest.map_structure(spec, y)
        count = tf.TensorSpec([], tf.float32)
        if w is None:
            graph = tf.function(
                lambda x_, y_, c: fn(x_, y_, None, c), input_signature=[xs, ys, count]
            )
            return lambda x_, y_, w_, c: graph(x_, y_, c)
        return tf.function(fn, input_signature=[xs, ys, spec(w), count])

    def _run(self, fn, batch):
        import tensorflow as tf

        batch = host_numpy(batch)
        x, y, w = unpack(batch)
        count = host_count(y, w, self.terms_kind, self.pad_id)
        if count <= 0:
            return None, 0.0
        if fn == "train":
            if self._train_fn is None:
                self._train_fn = self._graph(self._make_train_fn(), x, y, w)
            fn = self._train_fn
        elif fn == "eval":
            if self._eval_fn is None:
                self._eval_fn = self._graph(self._make_eval_fn(), x, y, w)
            fn = self._eval_fn
        parts = (x, y) if w is None else (x, y, w)
        split = _split(self.strategy, parts)
        if w is None:
            dx, dy = split
            dw = None
        else:
            dx, dy, dw = split
        loss = fn(dx, dy, dw, tf.constant(count, tf.float32))
        return float(loss), count


def make_engine(model, **kwargs):
    """The step runner of `fit` for Keras's backend: `Engine` (tf.distribute) under
    TensorFlow, `train.jax_engine.JaxEngine` (jitted stateless step) under JAX."""
    if keras.backend.backend() == "jax":
        from train.jax_engine import JaxEngine

        return JaxEngine(model, **kwargs)
    return Engine(model, **kwargs)


def _averaging_optimizer(model):
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return inner if getattr(inner, "use_ema", False) and inner.built else None


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
    and the best-on-dev weights see the averages; training and its checkpoints keep
    the raw weights, so a resumed run continues exactly. A no-op without `use_ema`."""
    optimizer = _averaging_optimizer(model)
    if optimizer is None:
        yield
        return
    variables = model.trainable_variables
    with _restoring(variables):
        optimizer.finalize_variable_values(variables)
        yield


def seconds_per_step(model, batches, warmup=1):
    """Mean wall time of one training step of the compiled `model`, over `batches`
    (a list of global batches; the first `warmup` are run untimed, tracing included).
    The mean, not the median: an epoch lasts the sum of its steps, and length-bucketed
    steps are skewed towards the long batches (median 86 ms, mean 101 ms on one run).

    Every model and optimizer variable (dropout seed states too) is put back
    afterwards, so the run that follows starts exactly as if nothing had run."""
    engine = make_engine(model)
    engine.build(batches[0])
    times = []
    try:
        with _restoring(list(model.variables) + list(engine.optimizer.variables)):
            for i, batch in enumerate(batches):
                if i >= warmup and getattr(engine, "compiles_per_shape", False):
                    engine.train_batch(batch)  # JAX: a new shape compiles; time the run only
                start = time.perf_counter()
                engine.train_batch(batch)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
    finally:
        engine.reset_metrics()
    return float(np.mean(times)) if times else 0.0


def _check_finite(loss, epoch, step, checkpoint_dir):
    if loss is not None and not math.isfinite(loss):
        kept = checkpoint.latest(checkpoint_dir)[0] if checkpoint_dir else None
        where = f"kept the last good checkpoint {kept}" if kept else "no checkpoint was written"
        raise NonFiniteLoss(
            f"training stopped: the loss became {loss} at epoch {epoch + 1}, step {step}; "
            f"{where} (lower --learning-rate, or check the data)"
        )


def _written(checkpoint_dir, chief, step, cluster=None):
    """What the stop wrote, for its one line (several workers stop at the same step:
    the chief wrote it)."""
    if not checkpoint_dir:
        return "no checkpoint directory, nothing written"
    if not chief:
        return (
            "the chief wrote the checkpoint"
            if cluster is not None
            else "not the chief, nothing written"
        )
    return f"wrote {os.path.join(checkpoint_dir, os.path.basename(checkpoint.path_for(checkpoint_dir, step)))}"


def fit(
    model,
    train_data,
    *,
    epochs,
    initial_epoch=0,
    validation_data=None,
    callbacks=(),
    verbose="auto",
    steps_per_epoch=None,
    checkpoint_dir=None,
    checkpoint_every=None,
    loss_terms=None,
    jit_compile=None,
    resume=True,
    announce=None,
    epochs_done=None,
):
    """Trains a compiled `model` like `model.fit`, under `train.strategy.get()`.

    train_data: `epoch -> sized iterable of global batches` ((x, y) or (x, y, weights),
        NumPy or tensors), or one sized iterable reused every epoch.
    checkpoint_dir: where step checkpoints go (None: none). With `resume`, a checkpoint
        there that is at or after `initial_epoch` is restored first and its epoch
        continues from the batch after the one it saved.
    announce: a line for stderr, printed once the checkpoint is restored (so that a
        checkpoint refused as not fitting the model is the only line).
    epochs_done: the epochs whose ends the callbacks' own state has recorded (the run's
        last.keras: after it fell back to its previous copy, fewer than the newest step
        checkpoints passed); a step checkpoint past them is not restored, so no epoch
        end is skipped. None: no bound.
    With `resume`, when every step checkpoint is damaged: falls back to the model as
    given if `initial_epoch` > 0 (an epoch-end state), else refuses (DamagedCheckpoint).
    Returns the `keras.callbacks.History`.
    """
    engine = make_engine(model, loss_terms=loss_terms, jit_compile=jit_compile)
    data = EpochData(train_data, steps_per_epoch)
    steps = data.steps()
    every = dist.checkpoint_every() if checkpoint_every is None else checkpoint_every
    chief = dist.is_chief()
    verbose = 1 if verbose == "auto" else verbose
    history = keras.callbacks.History()
    cbs = keras.callbacks.CallbackList(
        list(callbacks) + [history],
        add_history=False,
        add_progbar=verbose != 0,
        verbose=verbose,
        epochs=epochs,
        steps=steps,
        model=model,
    )
    first = next(iter(data.batches(initial_epoch)), None)
    if first is None:
        raise UsageError("no training batches")
    engine.build(first)

    epoch, skip = initial_epoch, 0
    partial, total, count = (0.0, 0.0), 0.0, 0.0
    restored = None
    if checkpoint_dir and resume:
        within = None
        if epochs_done is not None:

            def within(record):
                return record["epoch"] + bool(record.get("epoch_complete")) <= epochs_done

        path, record, damaged = checkpoint.latest_good(checkpoint_dir, accept=within)
        for bad, reason in damaged:
            if path:
                instead = f"falling back to {os.path.basename(path)}"
            elif initial_epoch > 0:
                instead = f"falling back to the state at the end of epoch {initial_epoch}"
            else:
                raise checkpoint.DamagedCheckpoint(
                    f"{reason}; no earlier checkpoint to fall back to"
                )
            print(f"{reason}; {instead}", file=sys.stderr)
        if record is not None and record["epoch"] >= initial_epoch:
            checkpoint.restore(path, model, engine.optimizer)
            epoch, skip = record["epoch"], record["batches_done"]
            if record.get("epoch_complete"):
                epoch, skip = record["epoch"] + 1, 0
            else:
                partial = tuple(record.get("partial_loss", partial))
            restored = f"restored {os.path.basename(path)}: epoch {epoch + 1}, batch {skip}"
    # After the restore: a checkpoint that does not fit is the run's one line on stderr.
    dist.announce()
    for line in (announce, restored):
        if line:
            print(line, file=sys.stderr)
    global_step = int(engine.optimizer.iterations.numpy())

    def save(epoch_, done, complete):
        if not (checkpoint_dir and chief):
            return
        # partial_loss: the epoch's running loss sum and count, so that a resumed epoch
        # reports the mean over all its batches (an epoch resumed after its last batch
        # has a loss too).
        checkpoint.save(
            checkpoint_dir,
            model,
            engine.optimizer,
            {
                "step": global_step,
                "epoch": epoch_,
                "batches_done": done,
                "epoch_complete": complete,
                "steps_per_epoch": steps,
                "partial_loss": [total, count],
                "strategy": dist.describe(),
            },
        )

    def stop_for_signal(epoch_, done):
        # The step is finished: save it (as an incomplete epoch, so that the resumed run
        # still validates and closes the epoch), then leave with the signal's exit code.
        save(epoch_, done, False)
        preemption.stop(
            f"{_written(checkpoint_dir, chief, global_step, cluster)} at epoch {epoch_ + 1}, batch {done}"
        )

    model.stop_training = False
    cbs.on_train_begin()
    logs = {}
    # Several workers agree on the step to stop after (one was signalled, all stop).
    stops = preemption.StepStops(*dist.worker())
    cluster = stops.cluster
    with preemption.listening(), contextlib.ExitStack() as cleanup:
        cleanup.callback(stops.close)
        while epoch < epochs and not model.stop_training:
            engine.reset_metrics()
            cbs.on_epoch_begin(epoch)
            (total, count), done = partial, skip
            partial = (0.0, 0.0)
            if count:
                logs = {"loss": total / count}
            for batch in _prefetched(data.batches(epoch, skip)):
                cbs.on_train_batch_begin(done)
                loss, n = engine.train_batch(batch)
                global_step += 1
                done += 1
                _check_finite(loss, epoch, global_step, checkpoint_dir)
                if loss is not None:
                    total += loss * n
                    count += n
                logs = {"loss": total / count if count else 0.0, **engine.metric_results()}
                cbs.on_train_batch_end(done - 1, logs)
                if every and global_step % every == 0 and done < steps:
                    save(epoch, done, False)
                if stops.signalled(global_step):
                    stop_for_signal(epoch, done)
                # The chief's wish to stop (time limit) holds for all workers, at one step.
                model.stop_training = stops.time_up(model.stop_training, global_step, chief)
                if model.stop_training:
                    break
            epoch_logs = dict(logs)
            if validation_data is not None:
                with averaged_weights(model):
                    val = engine.evaluate(validation_data)
                epoch_logs.update({f"val_{k}": v for k, v in val.items()})
            cbs.on_epoch_end(epoch, epoch_logs)
            save(epoch, done, done >= steps)
            if cluster is None and stops.signalled(global_step):  # several: at their next step
                preemption.stop(
                    f"{_written(checkpoint_dir, chief, global_step)} at the end of epoch {epoch + 1}"
                )
            logs = epoch_logs
            epoch, skip = epoch + 1, 0
        if stops.finish():  # a signal after the last step
            preemption.stop(
                f"{_written(checkpoint_dir, chief, global_step, cluster)} at the end of epoch {epoch}"
            )
    cbs.on_train_end(logs)
    return history
