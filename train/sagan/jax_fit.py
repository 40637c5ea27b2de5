"""The SAGAN training step under Keras's JAX backend: `SaganStep` (train/sagan/fit.py:
noise, schedule, checkpoint variables) with its D, G and EMA steps as jitted pure
functions around train/sagan/losses.py's losses.

Each step runs the models inside a `keras.StatelessScope` holding the values of every G
and D variable (so spectral-norm vectors and batch-norm statistics move as under
TensorFlow: G's in the D step's forward pass, D's in the G step's), differentiates the
loss with `jax.value_and_grad` with respect to the trained model's trainable values,
and applies `optimizer.stateless_apply`. The new values are written back into the
variables after each step, so sampling, quick FID and checkpoints read them as before.
Several devices: keras.distribution.DataParallel replicates the variables and the rows
are sharded (`place_batch`); XLA sums the gradients.
"""

import functools

import jax
import keras
import numpy as np
from keras import ops

from train.jax_step import assign, place_batch, values
from train.sagan import losses
from train.sagan.fit import SaganStep


def _with(old, index, replacement):
    new = list(old)
    for i, v in zip(index, replacement):
        new[i] = v
    return new


class JaxSaganStep(SaganStep):
    def _make_steps(self, jit_compile):
        # Unjitted only when asked (--no-jit-compile): a JAX step op by op is for debugging.
        self.jit_compile = jit_compile is not False
        wrap = jax.jit if self.jit_compile else (lambda f: f)
        self.d_step = wrap(self._d_pure)
        self.d_step_r1 = wrap(functools.partial(self._d_pure, r1=True))
        self.g_step = wrap(self._g_pure)
        self._ema_fn = wrap(functools.partial(losses.ema_update, decay=self.ema_decay))

    # ------------------------------------------------------------ pure steps
    def _d_logits_and_real_grads(self, images, labels, batch, d_vals):
        """`_d_logits` with D holding `d_vals` and the gradient of the first `batch`
        rows' logit sum with respect to `images` (R1), from one forward pass. D's state
        updates (spectral-norm vectors) leave `jax.vjp` as its auxiliary output and are
        written to the enclosing scope."""

        def forward(x):
            with keras.StatelessScope(state_mapping=list(zip(self.d.variables, d_vals))) as inner:
                logits, scores = self._d_logits(x, labels)
            return logits, (scores, [inner.get_current_value(v) for v in self.d.variables])

        logits, pullback, (scores, after) = jax.vjp(forward, images, has_aux=True)
        rows = ops.arange(logits.shape[0])[:, None] < batch
        (grads,) = pullback(ops.cast(rows, logits.dtype))
        for variable, value in zip(self.d.variables, after):
            variable.assign(value)
        return logits, scores, grads[:batch]

    def _descend(self, model, optimizer, state, run):
        """One `optimizer` step on `model` (G or D) down the loss `run(d_vals)` returns with
        G and D holding the state's values; returns (logs, the new state)."""
        g_vals, d_vals, opt_vals = state
        is_g = model is self.g
        own = g_vals if is_g else d_vals
        trainable = {id(v) for v in model.trainable_variables}
        index = [i for i, v in enumerate(model.variables) if id(v) in trainable]

        def loss_fn(trained):
            now = _with(own, index, trained)
            g_now, d_now = (now, d_vals) if is_g else (g_vals, now)
            # The loss with G and D holding these values, and their values after it.
            mapping = list(zip(self.g.variables, g_now)) + list(zip(self.d.variables, d_now))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                total, logs = run(d_now)
            g_new = [scope.get_current_value(v) for v in self.g.variables]
            d_new = [scope.get_current_value(v) for v in self.d.variables]
            with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, opt_vals))):
                return optimizer.scale_loss(total), (logs, g_new, d_new)

        trained = [own[i] for i in index]
        (_, (logs, g_new, d_new)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trained)
        trained, opt_vals = optimizer.stateless_apply(opt_vals, grads, trained)
        if is_g:
            return logs, (_with(g_new, index, trained), d_new, opt_vals)
        return logs, (g_new, _with(d_new, index, trained), opt_vals)

    def _d_pure(self, state, parts, global_batch, r1=False):
        real, labels, noise, fake_labels = parts

        def run(d_vals):
            fake = self.g(self._g_inputs(noise, fake_labels), training=True)
            images = ops.concatenate([real, ops.cast(fake, real.dtype)], axis=0)
            all_labels = ops.concatenate([labels, fake_labels], axis=0)
            grads_x = None
            if r1:
                logits, scores, grads_x = self._d_logits_and_real_grads(
                    images, all_labels, real.shape[0], d_vals
                )
            else:
                logits, scores = self._d_logits(images, all_labels)
            return losses.d_loss(self, logits, scores, labels, global_batch, grads_x)

        return self._descend(self.d, self.d_opt, state, run)

    def _g_pure(self, state, parts, global_batch):
        noise, labels = parts

        def run(_):
            fake = self.g(self._g_inputs(noise, labels), training=True)
            logits, scores = self._d_logits(fake, labels)
            return losses.g_loss(self, logits, scores, fake, noise, labels, global_batch)

        return self._descend(self.g, self.g_opt, state, run)

    # ------------------------------------------------------------ host side
    def _run(self, fn, optimizer, parts, rows):
        groups = (self.g.variables, self.d.variables, optimizer.variables)
        state = tuple(values(group) for group in groups)
        logs, state = fn(state, place_batch(parts), np.float32(rows))
        for group, new in zip(groups, state):
            assign(group, new)
        return logs

    def _run_ema(self):
        step = np.int64(keras.ops.convert_to_numpy(self.g_opt.iterations.value))
        new = self._ema_fn(values(self.ema.variables), values(self.g.variables), step)
        assign(self.ema.variables, new)
