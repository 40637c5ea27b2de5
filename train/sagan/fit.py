"""The SAGAN training step for `train.engine.fit`: n_dis, EMA of G, the learning-rate
decay, its checkpoint variables (`SaganStep`), and the TensorFlow step on any
`tf.distribute` strategy (`TfSaganStep`: one device, mirrored GPUs, several workers,
TPU); train/sagan/jax_fit.py has the JAX one.

One D step uses one real batch and one generated batch (concatenated, so D's
spectral-norm vectors move once per step); every `n_dis` D steps, one G step. The
losses are train/sagan/losses.py's, with y' drawn uniformly from the classes. Adam with
the CLI's rates and betas (train/sagan/__init__.py; why: benchmarks/sagan.md).

Distribution and XLA: docs/distributed.md, "SAGAN" (N replicas make the one-device
update, and see the noise one device or a resumed run would, drawn on the host from
(seed, D step, D or G)). `jit_compile` compiles a step on one replica only (one XLA
computation cannot reach the other replicas' variables); TPUStrategy compiles both itself.
"""

import functools

import keras
import numpy as np

try:
    import tensorflow as tf
except ImportError:  # a JAX-only install: train/sagan/jax_fit.py builds its own steps
    tf = None

from train.engine import Step, set_learning_rates
from train.model_step import apply_global, split
from train.sagan import losses
from train.strategy import RunContext

_D_NOISE, _G_NOISE = 0, 1


def _adam(lr, beta_1, beta_2):
    optimizer = keras.optimizers.Adam(lr, beta_1=beta_1, beta_2=beta_2)
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


class SaganStep(Step):
    """Trains G and D (and the EMA copy of G): `models` is (G, D, EMA-G or None), built
    in the scope of `context` (the run's train.strategy.RunContext; None: one device);
    `recipe`: the options (train.sagan.SaganConfig's fields) with num_classes and
    latent_dim. `jit_compile` XLA-compiles the steps where they can be (`self.jit_compile`
    says). A backend's `_make_steps` sets `d_step`, `d_step_r1` and `g_step`, which its
    `_run(fn, optimizer, parts, rows)` runs on the host's NumPy rows."""

    # The loss scales (mixed_float16 only): a checkpoint moves between precisions.
    optional = ("g_scale", "d_scale")

    def __init__(self, models, recipe, context=None, jit_compile=False):
        self.g, self.d, self.ema = models
        self.models = (self.g, self.d)
        self.strategy = (context or RunContext()).strategy
        self.num_classes, self.latent_dim = recipe.num_classes, recipe.latent_dim
        self.mode_seeking, self.r1 = float(recipe.mode_seeking), float(recipe.r1)
        self.class_loss = float(recipe.class_loss) if self.num_classes else 0.0
        if self.class_loss:
            # One forward pass gives the logits and the trunk features the class scores
            # are taken from (the same layers, so spectral-norm vectors move once per call).
            trunk = self.d.get_layer("block_4").output
            self._d_both = keras.Model(self.d.inputs, [self.d.outputs[0], trunk])
            self._class_scores = self.d.get_layer("logits").class_scores
        self.lr_g, self.lr_d = float(recipe.lr_g), float(recipe.lr_d)
        self.decay_from = float(recipe.lr_decay_from)
        self.n_dis, self.ema_decay, self.seed = recipe.n_dis, recipe.ema, int(recipe.seed)
        self.replicas = self.strategy.num_replicas_in_sync
        with self.strategy.scope():
            self.g_opt = _adam(self.lr_g, recipe.beta1, recipe.beta2)
            self.d_opt = _adam(self.lr_d, recipe.beta1, recipe.beta2)
            self.g_opt.build(self.g.trainable_variables)
            self.d_opt.build(self.d.trainable_variables)
        self._make_steps(jit_compile)

    # ------------------------------------------------------------ the engine's interface
    def variables(self):
        groups = {
            "g": self.g.variables,
            "d": self.d.variables,
            "g_opt": _inner(self.g_opt).variables,
            "d_opt": _inner(self.d_opt).variables,
        }
        if self.ema is not None:
            groups["ema"] = self.ema.variables
        for name, optimizer in (("g_scale", self.g_opt), ("d_scale", self.d_opt)):
            if optimizer is not _inner(optimizer):
                groups[name] = [optimizer.step_counter, optimizer.dynamic_scale]
        return groups

    def refs(self):
        return {"g_opt": self.g.trainable_variables, "d_opt": self.d.trainable_variables}

    def best_variables(self):
        """The sampling generator (the EMA of G, else G)."""
        return {"generator": (self.ema or self.g).variables}

    def train(self, batch, at):
        """One D step on the global batch (real images, labels: NumPy, all rows) at D
        step `at.step`, and a G step (+ EMA) when it is G's turn."""
        if self.decay_from < 1.0:
            # 1 until decay_from, then linear to 0 at the budget's end (at.progress), so
            # a run that swings late in the budget settles.
            scale = min(1.0, max(0.0, (1.0 - at.progress) / (1.0 - self.decay_from)))
            rates = ((self.g_opt, self.lr_g), (self.d_opt, self.lr_d))
            set_learning_rates(rates, scale)
        real, labels = (np.asarray(batch[0], np.float32), np.asarray(batch[1], np.int32))
        rows, step = len(real), at.step
        noise, fake_labels = self.latents(step, _D_NOISE, rows)
        d_step = self.d_step_r1 if self.r1_due(step) else self.d_step
        parts = (real, labels, noise, fake_labels)
        d_loss, d_real, d_fake = self._run(d_step, self.d_opt, parts, rows)
        logs = {"d_loss": d_loss, "d_real": d_real, "d_fake": d_fake}
        if (step + 1) % self.n_dis == 0:
            noise, fake_labels = self.latents(step, _G_NOISE, rows)
            if self.mode_seeking:  # rows 2i and 2i+1 share a label
                fake_labels[1::2] = fake_labels[0::2][: rows // 2]
            logs["g_loss"], seeking = self._run(self.g_step, self.g_opt, (noise, fake_labels), rows)
            if self.mode_seeking:
                logs["mode_seeking"] = seeking
            if self.ema is not None:
                self._run_ema()
        return {k: (float(v), 1.0) for k, v in logs.items()}

    # ------------------------------------------------------------ host side
    def latents(self, step, which, batch):
        """Noise [batch, latent_dim] and fake labels [batch] of D step `step` (which=0)
        or of the G step after it (which=1): a function of (seed, step, which) only."""
        rng = np.random.default_rng([self.seed, int(step), which])
        noise = rng.standard_normal((batch, self.latent_dim), dtype=np.float32)
        labels = rng.integers(0, max(self.num_classes or 1, 1), size=batch, dtype=np.int32)
        return noise, labels

    def r1_due(self, d_steps_done):
        """Whether D step `d_steps_done` (0-based) carries the lazy R1 penalty."""
        return bool(self.r1) and (d_steps_done + 1) % losses.R1_EVERY == 0

    def _g_inputs(self, noise, labels):
        return {"noise": noise, "label": labels} if self.num_classes else {"noise": noise}

    def _d_logits(self, images, labels):
        """D's logits [B, 1] (float32) and, with a class loss, the class scores [B, K]."""
        inputs = {"image": images, "label": labels} if self.num_classes else {"image": images}
        if not self.class_loss:
            return keras.ops.cast(self.d(inputs, training=True), "float32"), None
        logits, trunk = self._d_both(inputs, training=True)
        return keras.ops.cast(logits, "float32"), self._class_scores(trunk)


class TfSaganStep(SaganStep):
    """The steps as `tf.function`s on the strategy."""

    def _make_steps(self, jit_compile):
        for model in (m for m in (self.g, self.d, self.ema) if m is not None):
            for v in model.variables:
                if not self.strategy.extended.variable_created_in_scope(v.value):
                    raise ValueError(
                        f"{model.name} was not built in the strategy's scope (variable "
                        f"{v.path}); build G, D and EMA-G in strategy.scope()"
                    )
        self.jit_compile = (
            bool(jit_compile)
            and self.replicas == 1
            and not isinstance(self.strategy, tf.distribute.TPUStrategy)
        )

        total = functools.partial(self.strategy.reduce, tf.distribute.ReduceOp.SUM, axis=None)

        def distributed(replica):
            """`replica` on every replica, its logs summed across them."""

            def step(*args):
                return tf.nest.map_structure(total, self.strategy.run(replica, args=args))

            return tf.function(step, reduce_retracing=True, jit_compile=self.jit_compile)

        self.d_step = distributed(self._d_replica)
        self.d_step_r1 = distributed(functools.partial(self._d_replica, r1=True))
        self.g_step = distributed(self._g_replica)
        self.ema_step = tf.function(self._ema_step)

    def _d_replica(self, real, labels, noise, fake_labels, global_batch, r1=False):
        fake = self.g(self._g_inputs(noise, fake_labels), training=True)
        images = tf.concat([real, tf.cast(fake, real.dtype)], axis=0)
        all_labels = tf.concat([labels, fake_labels], axis=0)
        with tf.GradientTape() as tape:
            # One forward pass serves the loss and, on R1 steps, the input gradient (D
            # has no batch statistics, so the real logits depend on the real rows only).
            with tf.GradientTape(watch_accessed_variables=False) as inputs_tape:
                inputs_tape.watch(images)
                logits, scores = self._d_logits(images, all_labels)
                real_sum = tf.reduce_sum(logits[: tf.shape(real)[0]])
            grads_x = inputs_tape.gradient(real_sum, images)[: tf.shape(real)[0]] if r1 else None
            total, logs = losses.d_loss(self, logits, scores, labels, global_batch, grads_x)
            scaled = self.d_opt.scale_loss(total)
        grads = tape.gradient(scaled, self.d.trainable_variables)
        apply_global(self.d_opt, grads, self.d.trainable_variables, self.replicas)
        return logs

    def _g_replica(self, noise, labels, global_batch):
        with tf.GradientTape() as tape:
            fake = self.g(self._g_inputs(noise, labels), training=True)
            logits, scores = self._d_logits(fake, labels)
            total, logs = losses.g_loss(self, logits, scores, fake, noise, labels, global_batch)
            scaled = self.g_opt.scale_loss(total)
        grads = tape.gradient(scaled, self.g.trainable_variables)
        apply_global(self.g_opt, grads, self.g.trainable_variables, self.replicas)
        return logs

    def _ema_step(self, step):
        # Cross-replica context: one value per variable, assigned to every copy.
        values = losses.ema_update(self.ema.variables, self.g.variables, step, self.ema_decay)
        for target, value in zip(self.ema.variables, values):
            if "float" in str(target.dtype):
                target.assign(value)

    def _run(self, fn, optimizer, parts, rows):
        return fn(*split(self.strategy, parts), tf.constant(float(rows), tf.float32))

    def _run_ema(self):
        with self.strategy.scope():
            self.ema_step(tf.constant(self.g_opt.iterations.numpy(), tf.int64))
