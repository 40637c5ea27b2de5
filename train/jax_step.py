"""The compiled-model step of `train.engine.fit` under Keras's JAX backend.

`JaxModelStep` is `train.model_step.TfModelStep`'s counterpart (same loss, metrics,
checkpoint variables), so every model package runs unchanged on either backend. The
step is a pure function jitted with `jax.jit`: `model.stateless_call` for the forward
pass, `jax.value_and_grad`, then `optimizer.stateless_apply`; metrics update in a
`keras.StatelessScope`. Batches stay NumPy until the step, and each batch shape
compiles once. Under `keras.distribution.DataParallel` the batch rows are sharded over
the devices and XLA sums the gradients across them.

Variables are read at the start of each step and written back after it, so checkpoints,
weight averaging and `--resume` see and set the model's variables as under TensorFlow.
"""

import jax
import keras
import numpy as np

from train.model_step import ModelStep


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


def values(variables):
    return [v.value for v in variables]


def assign(variables, new_values):
    for variable, value in zip(variables, new_values):
        variable.assign(value)


class JaxModelStep(ModelStep):
    def _metric_variables(self):
        return [v for m, _ in self.metrics for v in m.variables]

    def _updated_metrics(self, metric_values, y, y_pred, w):
        variables = self._metric_variables()
        if not variables:
            return metric_values
        with keras.StatelessScope(state_mapping=list(zip(variables, metric_values))) as scope:
            self._update_metrics(y, y_pred, w)
        return [
            new if (new := scope.get_current_value(v)) is not None else old
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
            with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, opt_values))):
                scaled = optimizer.scale_loss(loss)
            return scaled, (loss, y_pred, non_trainable)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def step(state, x, y, w, count):
            trainable, non_trainable, opt_values, metric_values = state
            (_, (loss, y_pred, non_trainable)), grads = grad_fn(
                trainable, non_trainable, opt_values, x, y, w, count
            )
            trainable, opt_values = optimizer.stateless_apply(opt_values, grads, trainable)
            metric_values = self._updated_metrics(metric_values, y, y_pred, w)
            return loss, (trainable, non_trainable, opt_values, metric_values)

        return step

    def _make_eval_fn(self):
        model, terms = self.model, self.terms

        def step(state, x, y, w, count):
            trainable, non_trainable, _, metric_values = state
            y_pred, _ = model.stateless_call(trainable, non_trainable, x, training=False)
            loss_sum, _ = terms(y, y_pred, w)
            metric_values = self._updated_metrics(metric_values, y, y_pred, w)
            return loss_sum / count, (None, None, None, metric_values)

        return step

    def _run(self, mode, x, y, w, count):
        fn = self._fn(mode, jax.jit if self.jit_compile else lambda step: step)
        x, y, w = place_batch((x, y, w))
        groups = (
            self.model.trainable_variables,
            self.model.non_trainable_variables,
            self.optimizer.variables,
            self._metric_variables(),
        )
        state = tuple(values(group) for group in groups)
        loss, state = fn(state, x, y, w, np.float32(count))
        for group, new in zip(groups, state):
            if new is not None:
                assign(group, new)
        return float(loss)
