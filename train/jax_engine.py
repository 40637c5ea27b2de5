"""The training step of `train.engine.fit` under Keras's JAX backend.

`JaxEngine` has the interface of `train.engine.Engine` (build, train_batch, evaluate,
reset_metrics, metric_results, optimizer), so `engine.fit` and every model package run
unchanged on either backend. The step is a pure function jitted with `jax.jit`:
`model.stateless_call` for the forward pass, `jax.value_and_grad`, then
`optimizer.stateless_apply`; metrics update in a `StatelessScope`. Batches stay NumPy
until the step (tokenization and bucketing happen outside it), and each batch shape
compiles once.

The loss is the one `Engine` computes: the sum of per-example (per-token) losses over
the global batch divided by the host-counted global number of real examples, plus the
model's own losses; under `keras.distribution.DataParallel` the batch rows are sharded
over the devices and XLA sums the gradients across them (the gradient of one device).

Variables are read at the start of each step and written back after it, so callbacks,
checkpoints, weight averaging and `--resume` see and set the model's variables as under
TensorFlow.
"""

import jax
import keras
import numpy as np
from keras.src import backend as keras_backend

from train.engine_base import EngineBase, host_numpy
from train.loss_terms import host_count, unpack


def place_batch(parts):
    """Under a keras.distribution (DataParallel): the rows of each array sharded over the
    devices when they divide evenly, else replicated (a short last batch); unchanged
    without one."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return parts
    devices = distribution.device_mesh.devices.size

    def place(a):
        if a is None:
            return None
        if a.shape and a.shape[0] % devices == 0:
            layout = distribution.get_data_layout(a.shape)
        else:
            layout = keras.distribution.TensorLayout([None] * a.ndim, distribution.device_mesh)
        return jax.device_put(a, layout.backend_layout)

    return keras.tree.map_structure(place, parts)


class JaxEngine(EngineBase):
    # Each new batch shape compiles the step (seconds_per_step times the second call).
    compiles_per_shape = True

    def __init__(self, model, loss_terms=None, jit_compile=None, terms_kind=None, **_):
        super().__init__(model, loss_terms, terms_kind)
        # Under JAX an un-jitted step runs op by op (debugging only): XLA unless asked off.
        self.jit_compile = True if jit_compile is None else bool(jit_compile)

    def build(self, batch):
        x, y, w = unpack(host_numpy(batch))
        sample = keras.tree.map_structure(lambda a: a[:1], (x, y) if w is None else (x, y, w))
        self.model._symbolic_build(data_batch=sample)
        if not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)

    # ------------------------------------------------------------ state
    def _metric_variables(self):
        return [v for m in self._metrics() for v in m.variables]

    def _groups(self):
        return (
            self.model.trainable_variables,
            self.model.non_trainable_variables,
            self.optimizer.variables,
            self._metric_variables(),
        )

    def _state(self, groups):
        return tuple([v.value for v in group] for group in groups)

    @staticmethod
    def _write_back(groups, state):
        for group, values in zip(groups, state):
            for variable, value in zip(group, values):
                variable.assign(value)

    # ------------------------------------------------------------ steps
    def _update_metrics(self, metric_values, y, y_pred, w):
        variables = self._metric_variables()
        if not variables:
            return metric_values
        with keras_backend.StatelessScope(state_mapping=list(zip(variables, metric_values))) as s:
            for m in self._metrics():
                m.update_state(y, y_pred, w)
        return [
            new if (new := s.get_current_value(v)) is not None else old
            for v, old in zip(variables, metric_values)
        ]

    def _make_train_fn(self):
        model, optimizer, terms = self.model, self.optimizer, self.terms

        def loss_fn(trainable, non_trainable, opt_values, x, y, w, count):
            y_pred, non_trainable, losses = model.stateless_call(
                trainable, non_trainable, x, training=True, return_losses=True
            )
            loss_sum, _ = terms(y, y_pred, w)
            loss = loss_sum / count
            if losses:
                loss = loss + keras.ops.cast(sum(losses), "float32")
            # LossScaleOptimizer (float16) reads its scale from the optimizer variables.
            with keras_backend.StatelessScope(
                state_mapping=list(zip(optimizer.variables, opt_values))
            ):
                scaled = optimizer.scale_loss(loss)
            return scaled, (loss, y_pred, non_trainable)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def step(state, x, y, w, count):
            trainable, non_trainable, opt_values, metric_values = state
            (_, (loss, y_pred, non_trainable)), grads = grad_fn(
                trainable, non_trainable, opt_values, x, y, w, count
            )
            trainable, opt_values = optimizer.stateless_apply(opt_values, grads, trainable)
            metric_values = self._update_metrics(metric_values, y, y_pred, w)
            return loss, (trainable, non_trainable, opt_values, metric_values)

        return jax.jit(step) if self.jit_compile else step

    def _make_eval_fn(self):
        model, terms = self.model, self.terms

        def step(state, x, y, w, count):
            trainable, non_trainable, _, metric_values = state
            y_pred, _ = model.stateless_call(trainable, non_trainable, x, training=False)
            loss_sum, _ = terms(y, y_pred, w)
            metric_values = self._update_metrics(metric_values, y, y_pred, w)
            return loss_sum / count, metric_values

        return jax.jit(step) if self.jit_compile else step

    def _run(self, kind, batch):
        x, y, w = unpack(host_numpy(batch))
        count = host_count(y, w, self.terms_kind, self.pad_id)
        if count <= 0:
            return None, 0.0
        x, y, w = place_batch((x, y, w))
        groups = self._groups()
        state = self._state(groups)
        count_arg = np.float32(count)
        if kind == "train":
            if self._train_fn is None:
                self._train_fn = self._make_train_fn()
            loss, state = self._train_fn(state, x, y, w, count_arg)
            self._write_back(groups, state)
        else:
            if self._eval_fn is None:
                self._eval_fn = self._make_eval_fn()
            loss, metric_values = self._eval_fn(state, x, y, w, count_arg)
            self._write_back(groups[3:], (metric_values,))
        return float(loss), count
