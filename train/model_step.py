"""The training step of a compiled Keras model (the tagger, seq2seq, the Universal
Transformer) for `train.engine.fit`: `TfModelStep` on `tf.distribute` (one device,
mirrored GPUs, several workers, TPU) and `train.jax_step.JaxModelStep` (a jitted
stateless step) under Keras's JAX backend; `train.steps.make_step` picks the one of the backend.

The model's compile config gives the optimizer, the loss and the metrics. The loss
over the global batch (a (sum, count) pair, the count the host's: `host_count`) and the
batch's split across replicas and workers are docs/distributed.md's ("What the loop
guarantees"). `--mixed-precision` with float16 scales the loss
(`keras.optimizers.LossScaleOptimizer`, which `compile` installs).
"""

import keras
import numpy as np
from keras import ops

from train.engine import Step, averaged_weights, set_learning_rates
from train.strategy import RunContext


def host_numpy(batch):
    """A batch (tensors, arrays, None) as NumPy arrays on the host."""
    return keras.tree.map_structure(
        lambda a: None if a is None else np.asarray(a.numpy() if hasattr(a, "numpy") else a),
        batch,
    )


def split(strategy, batch):
    """Per-replica slices of a global batch: replica r of R gets rows [r*B/R, (r+1)*B/R)."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return batch
    total = int(keras.tree.flatten(batch)[0].shape[0])
    bounds = [round(r * total / replicas) for r in range(replicas + 1)]

    def value_fn(ctx):
        r = ctx.replica_id_in_sync_group
        return tf.nest.map_structure(lambda a: tf.constant(a[bounds[r] : bounds[r + 1]]), batch)

    return strategy.experimental_distribute_values_from_function(value_fn)


def _values(g, fn):
    """fn applied to a dense gradient, or to the values of an IndexedSlices one."""
    import tensorflow as tf

    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
    return fn(g)


def apply_global(optimizer, grads, variables, replicas):
    """Applies one replica's share of the global batch's gradient, from a replica context,
    so that R replicas update exactly as one device does.

    Keras's TF optimizer sums the replicas' gradients itself, but clips (clipnorm,
    global_clipnorm, clipvalue) and checks the loss scale on each replica's LOCAL
    gradient first. Here the clipping sees the global gradient: a dense one is summed
    here, clipped as the optimizer would, and handed over as 1/R of it; an embedding's
    IndexedSlices (one row per occurrence, whose multiplicity Keras's sparse updates
    count) stay this replica's rows, scaled by the global clip factor, so the
    optimizer's sum is the one device's slices. Its own clipping then changes nothing
    (tests/train/test_distributed.py: mirrored and two workers == one device)."""
    import tensorflow as tf

    if replicas > 1:
        ctx, total = tf.distribute.get_replica_context(), tf.distribute.ReduceOp.SUM
        sparse = [isinstance(g, tf.IndexedSlices) for g in grads]
        summed = iter(ctx.all_reduce(total, [g for g, s in zip(grads, sparse) if not s]))
        grads = [g if s else next(summed) for g, s in zip(grads, sparse)]
        squares = [tf.reduce_sum(tf.square(g.values if s else g)) for g, s in zip(grads, sparse)]
        squares = [q if not s else ctx.all_reduce(total, q) for q, s in zip(squares, sparse)]
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        scale = optimizer.dynamic_scale if inner is not optimizer else 1.0  # scaled grads
        if inner.clipnorm or inner.global_clipnorm:
            bound = (inner.clipnorm or inner.global_clipnorm) * scale
            norms = [tf.sqrt(q) for q in squares]
            if inner.global_clipnorm:
                norms = [tf.sqrt(tf.add_n(squares))] * len(grads)
            # tf.clip_by_norm's formula, with the global norm.
            grads = [
                _values(g, lambda v, n=n: v * bound / tf.maximum(n, bound))
                for g, n in zip(grads, norms)
            ]
        elif inner.clipvalue:
            bound = inner.clipvalue * scale
            grads = [_values(g, lambda v: tf.clip_by_value(v, -bound, bound)) for g in grads]
        grads = [g if s else g / replicas for g, s in zip(grads, sparse)]
        if inner is not optimizer:  # the squares are global: every replica skips, or none
            finite = tf.reduce_all([tf.math.is_finite(q) for q in squares])
            grads = [_values(g, lambda v: v * tf.where(finite, 1.0, float("nan"))) for g in grads]
    optimizer.apply(grads, variables)


def weighted_terms(loss):
    """(sum, count) from a Keras loss applied per element, weighted by sample weights
    (padding weight 0). Without weights every element counts."""
    if not isinstance(loss, keras.losses.Loss):
        loss = keras.losses.get(loss)
    per_element = loss.__class__.from_config({**loss.get_config(), "reduction": None})

    def terms(y, y_pred, sample_weight):
        values = ops.cast(per_element(y, y_pred), "float32")
        if sample_weight is None:
            return ops.sum(values), ops.cast(ops.size(values), "float32")
        w = ops.cast(sample_weight, "float32")
        return ops.sum(values * w), ops.sum(w)

    return terms


def masked_mean_terms(loss, pad_id=0):
    """(sum, count) for a loss that already averages over non-padding targets
    (e.g. seq2seq's MaskedSmoothedCrossEntropy): mean times the local count."""

    def terms(y, y_pred, sample_weight):
        count = ops.sum(ops.cast(ops.not_equal(y, pad_id), "float32"))
        return ops.cast(loss(y, y_pred), "float32") * count, count

    terms.pad_id = pad_id  # host_count counts the targets that are not padding
    return terms


def host_count(y, w, terms):
    """The global normaliser of `terms`, computed on the host from the whole global batch
    (each worker holds it), so no collective is needed inside the compiled step."""
    if w is not None:
        return float(np.sum(np.asarray(w, np.float64)))
    if getattr(terms, "pad_id", None) is not None:
        return float(np.sum(np.asarray(y) != terms.pad_id))
    return float(np.prod(np.shape(y)))


class ModelStep(Step):
    """What both backends share: the model, its optimizer, loss terms and metrics, the
    batch accounting, evaluation, and the variables a checkpoint holds. Subclasses
    define `_make_train_fn`, `_make_eval_fn` and `_run(mode, x, y, w, count)` -> loss,
    mode "train" or "eval". `context`: the command's train.strategy.RunContext (its
    strategy, and XLA unless `jit_compile` says); None: one device. `rate`: the learning
    rate at each step's `At`, set into the optimizer's learning-rate variable (compiled
    with a number) before the step, or None: the compiled rate or schedule."""

    def __init__(self, model, loss_terms=None, jit_compile=None, context=None, rate=None):
        self.model = model
        self.rate = rate
        self.models = (model,)
        self.optimizer = model.optimizer
        self.terms = loss_terms or weighted_terms(model.loss)
        context = context or RunContext()
        self.strategy = context.strategy
        self.jit_compile = context.jit_compile if jit_compile is None else bool(jit_compile)
        compiled = model.get_compile_config() or {}
        with self.strategy.scope():  # fresh copies of the compiled metrics: (metric, weighted)
            self.metrics = [
                (keras.metrics.get(m), key == "weighted_metrics")
                for key in ("metrics", "weighted_metrics")
                for m in compiled.get(key) or []
            ]
        self._fns = {}

    def build(self, batch):
        """Creates every variable (model, optimizer slots) under the strategy's scope,
        before any step runs in a replica context."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(host_numpy(batch))
        with self.strategy.scope():
            self.model(keras.tree.map_structure(lambda a: a[:1], x), training=False)
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)

    def variables(self):
        return {"model": self.model.variables, "optimizer": self.optimizer.variables}

    def refs(self):
        return {"optimizer": self.model.trainable_variables}

    def best_variables(self):
        return {"model": self.model.variables}

    def averaged(self):
        return averaged_weights(self.model)

    def _update_metrics(self, y, y_pred, w):
        for metric, weighted in self.metrics:
            metric.update_state(y, y_pred, w if weighted else None)

    def reset_metrics(self):
        for metric, _ in self.metrics:
            metric.reset_state()

    def metric_results(self):
        return {m.name: float(m.result()) for m, _ in self.metrics}

    def _fn(self, mode, wrap):
        """The step function of `mode`, made and passed through `wrap` once."""
        if mode not in self._fns:
            make = self._make_train_fn if mode == "train" else self._make_eval_fn
            self._fns[mode] = wrap(make())
        return self._fns[mode]

    def _batch(self, mode, batch):
        x, y, w = keras.utils.unpack_x_y_sample_weight(host_numpy(batch))
        count = host_count(y, w, self.terms)
        if count <= 0:
            return None, 0.0
        return self._run(mode, x, y, w, count), count

    def train(self, batch, at=None):
        if self.rate is not None and at is not None:
            set_learning_rates([(self.optimizer, 1.0)], self.rate(at))
        loss, count = self._batch("train", batch)
        return {} if loss is None else {"loss": (loss, count)}

    def evaluate(self, batches):
        self.reset_metrics()
        total, count = 0.0, 0.0
        for batch in batches:
            loss, n = self._batch("eval", batch)
            if loss is not None:
                total += loss * n
                count += n
        return {"loss": total / count if count else float("nan"), **self.metric_results()}


class TfModelStep(ModelStep):
    def _make_train_fn(self):
        import tensorflow as tf

        model, optimizer, terms = self.model, self.optimizer, self.terms
        replicas = self.strategy.num_replicas_in_sync

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

        def replica_step(x, y, w, global_count):
            loss, grads, y_pred = compiled(x, y, w, global_count)
            apply_global(optimizer, grads, model.trainable_variables, replicas)
            self._update_metrics(y, y_pred, w)
            return loss

        return replica_step

    def _make_eval_fn(self):
        model, terms = self.model, self.terms

        def replica_step(x, y, w, global_count):
            y_pred = model(x, training=False)
            loss_sum, _ = terms(y, y_pred, w)
            self._update_metrics(y, y_pred, w)
            return loss_sum / global_count

        return replica_step

    def _graph(self, replica_step, x, y, w):
        """One trace for every batch shape on one replica (dynamic dimensions; XLA still
        compiles per shape); several replicas: traces generalised after the first shapes."""
        import tensorflow as tf

        def fn(x, y, w, count):
            per_replica = self.strategy.run(replica_step, args=(x, y, w, count))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

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
            return lambda x_, y_, _, c: graph(x_, y_, c)
        return tf.function(fn, input_signature=[xs, ys, spec(w), count])

    def _run(self, mode, x, y, w, count):
        import tensorflow as tf

        fn = self._fn(mode, lambda replica_step: self._graph(replica_step, x, y, w))
        parts = split(self.strategy, (x, y) if w is None else (x, y, w))
        dx, dy, dw = (*parts, None) if w is None else parts
        return float(fn(dx, dy, dw, tf.constant(count, tf.float32)))
