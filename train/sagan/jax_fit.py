"""The SAGAN training step under Keras's JAX backend: `SaganTrainer` with its D, G and
EMA steps as jitted pure functions (the losses, noise, schedule, checkpoints and state of
train/sagan/fit.py unchanged).

Each step runs the models inside a `StatelessScope` holding the values of every G and D
variable (so spectral-norm vectors and batch-norm statistics move as under TensorFlow:
G's in the D step's forward pass, D's in the G step's), differentiates the loss with
`jax.value_and_grad` with respect to the trained model's trainable values, and applies
`optimizer.stateless_apply`. The new values are written back into the variables after
each step, so sampling, quick FID, checkpoints and `--resume` read them as before.
"""

import functools

import jax
import keras
import numpy as np
from keras import ops
from keras.src import backend as keras_backend

from train.jax_engine import place_batch
from train.sagan import losses
from train.sagan.fit import _D_NOISE, _G_NOISE, SaganTrainer


class JaxSaganTrainer(SaganTrainer):
    def _make_steps(self, jit_compile):
        # Several devices: keras.distribution.DataParallel replicates the variables and
        # the rows are sharded (place_batch); XLA sums the gradients. Unjitted only when
        # asked (--no-jit-compile): a JAX step op by op is for debugging.
        self.jit_compile = jit_compile is not False
        wrap = jax.jit if self.jit_compile else (lambda f: f)
        self._d_fn = wrap(self._d_pure)
        self._d_r1_fn = wrap(functools.partial(self._d_pure, r1=True))
        self._g_fn = wrap(self._g_pure)
        self._ema_fn = wrap(self._ema_pure)

    # ------------------------------------------------------------ pure steps
    def _trained_index(self, model):
        ids = {id(v) for v in model.trainable_variables}
        return [i for i, v in enumerate(model.variables) if id(v) in ids]

    def _forward(self, g_vals, d_vals, fn):
        """fn() run with G's and D's variables holding g_vals / d_vals; returns fn's
        result and the variables' values after it (updated statistics)."""
        mapping = list(zip(self.g.variables, g_vals)) + list(zip(self.d.variables, d_vals))
        with keras_backend.StatelessScope(state_mapping=mapping) as scope:
            out = fn()
        g_new = [scope.get_current_value(v) for v in self.g.variables]
        d_new = [scope.get_current_value(v) for v in self.d.variables]
        return out, g_new, d_new

    def _d_logits(self, images, labels):
        inputs = self._d_inputs(images, labels)
        if not self.class_loss:
            return ops.cast(self.d(inputs, training=True), "float32"), None
        logits, trunk = self._d_both(inputs, training=True)
        return ops.cast(logits, "float32"), self._class_scores(trunk)

    def _d_logits_and_real_grads(self, images, labels, batch):
        """`_d_logits` and the gradient of the first `batch` rows' logit sum with respect
        to `images` (R1), from one forward pass. D's state updates (spectral-norm vectors)
        leave `jax.vjp` as its auxiliary output and are written to the enclosing scope."""
        scope = keras_backend.get_stateless_scope()
        before = [scope.get_current_value(v) for v in self.d.variables]

        def forward(x):
            mapping = list(zip(self.d.variables, before))
            with keras_backend.StatelessScope(state_mapping=mapping) as inner:
                logits, scores = self._d_logits(x, labels)
            return logits, (scores, [inner.get_current_value(v) for v in self.d.variables])

        logits, pullback, (scores, after) = jax.vjp(forward, images, has_aux=True)
        rows = ops.arange(logits.shape[0])[:, None] < batch
        (grads,) = pullback(ops.cast(rows, logits.dtype))
        for variable, value in zip(self.d.variables, after):
            variable.assign(value)
        return logits, scores, grads[:batch]

    def _scaled(self, optimizer, opt_vals, loss):
        with keras_backend.StatelessScope(state_mapping=list(zip(optimizer.variables, opt_vals))):
            return optimizer.scale_loss(loss)

    @staticmethod
    def _with(values, index, replacement):
        values = list(values)
        for i, v in zip(index, replacement):
            values[i] = v
        return values

    def _d_pure(
        self, g_vals, d_vals, opt_vals, real, labels, noise, fake_labels, global_batch, r1=False
    ):
        index = self._trained_index(self.d)
        batch = real.shape[0]

        def loss_fn(trained):
            def run():
                fake = self.g(self._g_inputs(noise, fake_labels), training=True)
                images = ops.concatenate([real, ops.cast(fake, real.dtype)], axis=0)
                all_labels = ops.concatenate([labels, fake_labels], axis=0)
                if r1:
                    logits, scores, grads_x = self._d_logits_and_real_grads(
                        images, all_labels, batch
                    )
                else:
                    logits, scores = self._d_logits(images, all_labels)
                return losses.d_loss(
                    self, logits, scores, labels, global_batch, grads_x if r1 else None
                )

            (total, logs), g_new, d_new = self._forward(
                g_vals, self._with(d_vals, index, trained), run
            )
            return self._scaled(self.d_opt, opt_vals, total), (logs, g_new, d_new)

        trained = [d_vals[i] for i in index]
        (_, (logs, g_new, d_new)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trained)
        trained, opt_vals = self.d_opt.stateless_apply(opt_vals, grads, trained)
        return logs, g_new, self._with(d_new, index, trained), opt_vals

    def _g_pure(self, g_vals, d_vals, opt_vals, noise, labels, global_batch):
        index = self._trained_index(self.g)

        def loss_fn(trained):
            def run():
                fake = self.g(self._g_inputs(noise, labels), training=True)
                logits, scores = self._d_logits(fake, labels)
                return losses.g_loss(self, logits, scores, fake, noise, labels, global_batch)

            (total, logs), g_new, d_new = self._forward(
                self._with(g_vals, index, trained), d_vals, run
            )
            return self._scaled(self.g_opt, opt_vals, total), (logs, g_new, d_new)

        trained = [g_vals[i] for i in index]
        (_, (logs, g_new, d_new)), grads = jax.value_and_grad(loss_fn, has_aux=True)(trained)
        trained, opt_vals = self.g_opt.stateless_apply(opt_vals, grads, trained)
        return logs, self._with(g_new, index, trained), d_new, opt_vals

    def _ema_pure(self, ema_vals, g_vals, step):
        return losses.ema_update(ema_vals, g_vals, step, self.ema_decay)

    # ------------------------------------------------------------ host side
    @staticmethod
    def _values(variables):
        return [v.value for v in variables]

    @staticmethod
    def _assign(variables, values):
        for v, value in zip(variables, values):
            v.assign(value)

    def train_batch(self, real, labels, d_steps_done):
        """One D step on the global batch, and a G step (+ EMA) when it is G's turn,
        as `SaganTrainer.train_batch`. Returns logs (floats)."""
        rows = len(real)
        global_batch = np.float32(rows)
        noise, fake_labels = self.latents(d_steps_done, _D_NOISE, rows)
        parts = place_batch(
            (np.asarray(real, np.float32), np.asarray(labels, np.int32), noise, fake_labels)
        )
        d_fn = self._d_r1_fn if self.r1_due(d_steps_done) else self._d_fn
        (d_loss, real_logit, fake_logit), g_vals, d_vals, opt_vals = d_fn(
            self._values(self.g.variables),
            self._values(self.d.variables),
            self._values(self.d_opt.variables),
            *parts,
            global_batch,
        )
        self._assign(self.g.variables, g_vals)
        self._assign(self.d.variables, d_vals)
        self._assign(self.d_opt.variables, opt_vals)
        logs = {"d_loss": float(d_loss), "d_real": float(real_logit), "d_fake": float(fake_logit)}
        if (d_steps_done + 1) % self.n_dis == 0:
            noise, fake_labels = self.latents(d_steps_done, _G_NOISE, rows)
            if self.mode_seeking:
                fake_labels[1::2] = fake_labels[0::2][: rows // 2]
            (g_loss, seeking), g_vals, d_vals, opt_vals = self._g_fn(
                self._values(self.g.variables),
                self._values(self.d.variables),
                self._values(self.g_opt.variables),
                *place_batch((noise, fake_labels)),
                global_batch,
            )
            self._assign(self.g.variables, g_vals)
            self._assign(self.d.variables, d_vals)
            self._assign(self.g_opt.variables, opt_vals)
            logs["g_loss"] = float(g_loss)
            if self.mode_seeking:
                logs["mode_seeking"] = float(seeking)
            if self.ema is not None:
                step = np.int64(keras.ops.convert_to_numpy(self.g_opt.iterations.value))
                self._assign(
                    self.ema.variables,
                    self._ema_fn(
                        self._values(self.ema.variables), self._values(self.g.variables), step
                    ),
                )
        return logs
