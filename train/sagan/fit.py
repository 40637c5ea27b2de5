"""The SAGAN training step: hinge loss, n_dis, EMA of G, resumable state,
under any `tf.distribute` strategy (one device, mirrored GPUs, several workers, TPU).

One D step uses one real batch and one generated batch (concatenated, so D's
spectral-norm vectors move once per step); every `n_dis` D steps, one G step. The
losses are train/sagan/losses.py's, with y' drawn uniformly from the classes.
Adam(beta_1=0, beta_2=0.9); the rates are the caller's (the CLI's defaults and why:
train/sagan/__init__.py).

Distribution (as train/engine.py): the global batch is split row-wise across the
replicas; each replica's hinge loss is the SUM over its rows divided by the GLOBAL
batch size, and gradients are summed across replicas before Adam, so N replicas
make exactly the one-device update. The latent noise and fake labels are drawn on
the host from a generator seeded by (seed, D step, D or G) and split like the real
batch: the same run on 1 or N replicas sees the same noise, and a resumed run the
noise the uninterrupted run would have seen. The generator's batch norms are
synchronised across replicas (zoo/sagan/model.py). The EMA of G is updated in
cross-replica context. Under `mixed_float16` both optimizers scale the loss
(`keras.optimizers.LossScaleOptimizer`).

XLA (`jit_compile=True`, `--jit-compile`): the D step (G's forward pass, D's
forward and backward pass, Adam) and the G step (G's and D's forward pass, G's
backward pass, Adam) are each one XLA computation on one replica. G's upsampling
carries its own gradient (`zoo.sagan.model.upsample_nearest_2x`): TensorFlow's,
`ResizeNearestNeighborGrad`, has no XLA kernel outside TPUs.
On several replicas neither step is compiled: an XLA computation runs on one device
and cannot reach the other replicas' variables ("Trying to access resource ...
located in device CPU:1 from device CPU:0" on two logical CPUs, for the whole step
and for the per-replica function alike). TPUStrategy compiles both steps itself.

The whole training state (G, D, EMA-G variables and both optimizers' slots, and the
JSON state) is saved as one .npz written atomically, plus a copy of the JSON state in
`state.json`; `restore` puts it back into freshly built models, so `--resume`
continues where the run stopped. Values are stored per variable, not per device: a
checkpoint written on N replicas restores on any number of replicas.
"""

import functools
import json
import os
import sys

import keras
import numpy as np

try:
    import tensorflow as tf
except ImportError:  # a JAX-only install: train/sagan/jax_fit.py builds its own steps
    tf = None

from train import checkpoint
from train.engine import _reduce_before_clipping, _split
from train.rundir import read_json
from train.sagan import losses
from train.sagan.losses import R1_EVERY
from zoo import atomic
from zoo.cli import UsageError

STATE_NPZ = "state.npz"
STATE_JSON = "state.json"
STATE_PREV = "state.prev.npz"
_STATE_KEY = "__state__"
_BEST = "__best__/"
_D_NOISE, _G_NOISE = 0, 1


def _adam(lr, beta_1, beta_2):
    optimizer = keras.optimizers.Adam(lr, beta_1=beta_1, beta_2=beta_2)
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _check_in_scope(strategy, models):
    for model in models:
        for v in model.variables:
            if not strategy.extended.variable_created_in_scope(getattr(v, "value", v)):
                raise ValueError(
                    f"{model.name} was not built in the strategy's scope "
                    f"(variable {v.path}); build G, D and EMA-G in strategy.scope()"
                )


class SaganTrainer:
    """Trains `generator` and `discriminator` (and the EMA copy `ema` of G).

    The models must have been built in `strategy.scope()` (default: the current
    `tf.distribute.get_strategy()`); the optimizers are built here, in that scope.
    `seed` seeds the latent noise and fake labels of every step. `jit_compile`
    XLA-compiles the D and G steps on one replica (the module docstring says why not
    on several replicas); `self.jit_compile` says whether they are.
    """

    def __init__(
        self,
        generator,
        discriminator,
        *,
        num_classes,
        latent_dim,
        lr_g=1e-4,
        lr_d=4e-4,
        beta_1=0.0,
        beta_2=0.9,
        n_dis=1,
        ema=None,
        ema_decay=0.999,
        seed=0,
        strategy=None,
        jit_compile=False,
        mode_seeking=0.0,
        class_loss=0.0,
        r1=0.0,
    ):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.mode_seeking = float(mode_seeking)
        self.r1 = float(r1)
        self.class_loss = float(class_loss) if num_classes else 0.0
        if self.class_loss:
            # One forward pass gives the logits and the trunk features the class scores
            # are taken from (the same layers, so spectral-norm vectors move once per call).
            head = discriminator.get_layer("logits")
            trunk = discriminator.get_layer("block_4").output
            self._d_both = keras.Model(discriminator.inputs, [discriminator.outputs[0], trunk])
            self._class_scores = head.class_scores
        self.g, self.d, self.ema = generator, discriminator, ema
        self.lr_g, self.lr_d = float(lr_g), float(lr_d)
        self._lr_scale = None  # unknown until set (a restored checkpoint carries its own)
        self.best = (
            None  # {canonical variable key: value} of the kept sampler, saved with the state
        )
        self.num_classes = num_classes
        self.latent_dim = latent_dim
        self.n_dis = n_dis
        self.ema_decay = ema_decay
        self.seed = int(seed)
        self.replicas = self.strategy.num_replicas_in_sync
        with self.strategy.scope():
            self.g_opt = _adam(lr_g, beta_1, beta_2)
            self.d_opt = _adam(lr_d, beta_1, beta_2)
            self.g_opt.build(self.g.trainable_variables)
            self.d_opt.build(self.d.trainable_variables)
        self._make_steps(jit_compile)

    def _make_steps(self, jit_compile):
        """The tf.function D, G and EMA steps (train/sagan/jax_fit.py: JAX's)."""
        _check_in_scope(self.strategy, [m for m in (self.g, self.d, self.ema) if m is not None])
        if self.replicas > 1:
            # Keras's TF optimizer does sum gradients across replicas itself (in
            # `_backend_update_step`, replica context), but LossScaleOptimizer checks
            # for Inf/NaN BEFORE that sum, on each replica's local gradients, so replicas
            # could disagree on skipping a step. As the engine does, the replica steps
            # sum first and the optimizers' own summation is turned off.
            for optimizer in (self.g_opt, self.d_opt):
                _reduce_before_clipping(optimizer)
        self.jit_compile = (
            bool(jit_compile)
            and self.replicas == 1
            and not isinstance(self.strategy, tf.distribute.TPUStrategy)
        )
        self.d_step = tf.function(self._d_step, reduce_retracing=True, jit_compile=self.jit_compile)
        self.d_step_r1 = tf.function(
            functools.partial(self._d_step, r1=True),
            reduce_retracing=True,
            jit_compile=self.jit_compile,
        )
        self.g_step = tf.function(self._g_step, reduce_retracing=True, jit_compile=self.jit_compile)
        self.ema_step = tf.function(self._ema_step)

    def set_lr_scale(self, scale):
        """Sets both learning rates to `scale` times the initial ones (the CLI's decay
        over the end of the budget); the rates are optimizer variables, so a
        checkpoint carries the current ones."""
        scale = float(scale)
        if scale != self._lr_scale:
            for optimizer, base in ((self.g_opt, self.lr_g), (self.d_opt, self.lr_d)):
                _inner(optimizer).learning_rate.assign(base * scale)
            self._lr_scale = scale

    def remember_best(self, model):
        """Keeps a copy of `model`'s weights (the sampling generator at its best epoch so
        far); `save` writes it with the state, keyed like the checkpoint's variables."""
        keys = checkpoint.canonical(checkpoint.variable_paths(model.variables))
        self.best = {k: np.array(v.numpy()) for k, v in zip(keys, model.variables)}

    def apply_best(self, model):
        """Puts the kept weights into `model`; False when none are kept."""
        if not self.best:
            return False
        keys = checkpoint.canonical(checkpoint.variable_paths(model.variables))
        missing = [k for k in keys if k not in self.best]
        if missing or len(keys) != len(self.best):
            raise UsageError(
                f"the kept best generator does not fit this model "
                f"({(missing or sorted(set(self.best) - set(keys)))[0]!r} differs)"
            )
        for key, v in zip(keys, model.variables):
            v.assign(self.best[key])
        return True

    # ------------------------------------------------------------ steps
    def _g_inputs(self, noise, labels):
        return {"noise": noise, "label": labels} if self.num_classes else {"noise": noise}

    def _d_inputs(self, images, labels):
        return {"image": images, "label": labels} if self.num_classes else {"image": images}

    def latents(self, step, which, batch):
        """Noise [batch, latent_dim] and fake labels [batch] of D step `step` (which=0)
        or of the G step after it (which=1): a function of (seed, step, which) only."""
        rng = np.random.default_rng([self.seed, int(step), which])
        noise = rng.standard_normal((batch, self.latent_dim), dtype=np.float32)
        labels = rng.integers(0, max(self.num_classes or 1, 1), size=batch, dtype=np.int32)
        return noise, labels

    def _apply(self, optimizer, grads, variables):
        if self.replicas > 1:
            grads = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, grads
            )
        optimizer.apply(grads, variables)

    def _d_forward(self, images, labels):
        """D's logits [B, 1] (float32) and, with a class loss, the class scores [B, K]."""
        inputs = self._d_inputs(images, labels)
        if not self.class_loss:
            return tf.cast(self.d(inputs, training=True), tf.float32), None
        logits, trunk = self._d_both(inputs, training=True)
        return tf.cast(logits, tf.float32), self._class_scores(trunk)

    def r1_due(self, d_steps_done):
        """Whether D step `d_steps_done` (0-based) carries the lazy R1 penalty."""
        return bool(self.r1) and (d_steps_done + 1) % R1_EVERY == 0

    def _d_replica(self, real, labels, noise, fake_labels, global_batch, r1=False):
        fake = self.g(self._g_inputs(noise, fake_labels), training=True)
        images = tf.concat([real, tf.cast(fake, real.dtype)], axis=0)
        all_labels = tf.concat([labels, fake_labels], axis=0)
        with tf.GradientTape() as tape:
            # One forward pass serves the loss and, on R1 steps, the input gradient (D
            # has no batch statistics, so the real logits depend on the real rows only).
            with tf.GradientTape(watch_accessed_variables=False) as inputs_tape:
                inputs_tape.watch(images)
                logits, scores = self._d_forward(images, all_labels)
                real_sum = tf.reduce_sum(logits[: tf.shape(real)[0]])
            grads_x = inputs_tape.gradient(real_sum, images)[: tf.shape(real)[0]] if r1 else None
            total, logs = losses.d_loss(self, logits, scores, labels, global_batch, grads_x)
            scaled = self.d_opt.scale_loss(total)
        grads = tape.gradient(scaled, self.d.trainable_variables)
        self._apply(self.d_opt, grads, self.d.trainable_variables)
        return logs

    def _g_replica(self, noise, labels, global_batch):
        with tf.GradientTape() as tape:
            fake = self.g(self._g_inputs(noise, labels), training=True)
            logits, scores = self._d_forward(fake, labels)
            total, logs = losses.g_loss(self, logits, scores, fake, noise, labels, global_batch)
            scaled = self.g_opt.scale_loss(total)
        grads = tape.gradient(scaled, self.g.trainable_variables)
        self._apply(self.g_opt, grads, self.g.trainable_variables)
        return logs

    def _sum(self, per_replica):
        return tf.nest.map_structure(
            lambda v: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None), per_replica
        )

    def _d_step(self, real, labels, noise, fake_labels, global_batch, r1=False):
        return self._sum(
            self.strategy.run(
                functools.partial(self._d_replica, r1=r1),
                args=(real, labels, noise, fake_labels, global_batch),
            )
        )

    def _g_step(self, noise, labels, global_batch):
        return self._sum(self.strategy.run(self._g_replica, args=(noise, labels, global_batch)))

    def _ema_step(self, step):
        # Cross-replica context: one value per variable, assigned to every copy.
        values = losses.ema_update(self.ema.variables, self.g.variables, step, self.ema_decay)
        for target, value in zip(self.ema.variables, values):
            if "float" in str(target.dtype):
                target.assign(value)

    def train_batch(self, real, labels, d_steps_done):
        """One D step on the global batch (`real`, `labels`: NumPy, all rows), and a
        G step (+ EMA) when it is G's turn. Returns logs (floats)."""
        rows = len(real)
        global_batch = tf.constant(float(rows), tf.float32)
        noise, fake_labels = self.latents(d_steps_done, _D_NOISE, rows)
        parts = _split(
            self.strategy,
            (np.asarray(real, np.float32), np.asarray(labels, np.int32), noise, fake_labels),
        )
        d_step = self.d_step_r1 if self.r1_due(d_steps_done) else self.d_step
        d_loss, real_logit, fake_logit = d_step(*parts, global_batch)
        logs = {"d_loss": float(d_loss), "d_real": float(real_logit), "d_fake": float(fake_logit)}
        if (d_steps_done + 1) % self.n_dis == 0:
            noise, fake_labels = self.latents(d_steps_done, _G_NOISE, rows)
            if self.mode_seeking:
                fake_labels[1::2] = fake_labels[0::2][: rows // 2]
            g_loss, seeking = self.g_step(
                *_split(self.strategy, (noise, fake_labels)), global_batch
            )
            logs["g_loss"] = float(g_loss)
            if self.mode_seeking:
                logs["mode_seeking"] = float(seeking)
            if self.ema is not None:
                with self.strategy.scope():
                    self.ema_step(tf.constant(self.g_opt.iterations.numpy(), tf.int64))
        return logs

    # ------------------------------------------------------------ state
    def _groups(self):
        groups = {
            "g": self.g.variables,
            "d": self.d.variables,
            "g_opt": _inner(self.g_opt).variables,
            "d_opt": _inner(self.d_opt).variables,
        }
        if self.ema is not None:
            groups["ema"] = self.ema.variables
        # The loss scale (mixed_float16 only) is its own group, so a checkpoint moves
        # between float32/bfloat16 and float16 runs.
        for name, optimizer in (("g_scale", self.g_opt), ("d_scale", self.d_opt)):
            if optimizer is not _inner(optimizer):
                groups[name] = [optimizer.step_counter, optimizer.dynamic_scale]
        return groups

    def _refs(self):
        """The variables each optimizer group updates (checkpoint keys name them)."""
        return {
            "g_opt": self.g.trainable_variables,
            "d_opt": self.d.trainable_variables,
            "g_scale": [],
            "d_scale": [],
        }

    def save(self, directory, state):
        """Writes the state (the caller writes on the chief only): every variable keyed
        by its path (train.checkpoint), the models' config hash and a SHA-256; the
        previous state.npz is kept as state.prev.npz, the fallback of `restore`."""
        os.makedirs(directory, exist_ok=True)
        # The JSON state travels inside the one atomically replaced .npz: a run killed
        # between the two files' renames still resumes from a matching pair.
        arrays = checkpoint.pack(
            self._groups(),
            refs=self._refs(),
            config=checkpoint.config_hash(self.g, self.d),
            extra={
                _STATE_KEY: np.array(json.dumps(state)),
                **{_BEST + k: v for k, v in (self.best or {}).items()},
            },
        )
        checkpoint.write_npz(
            os.path.join(directory, STATE_NPZ), arrays, previous=os.path.join(directory, STATE_PREV)
        )
        atomic.write_json(os.path.join(directory, STATE_JSON), state)

    def restore(self, directory):
        """Restores state.npz, or state.prev.npz (saying so) when state.npz is damaged;
        refuses (UsageError, one line) a checkpoint of other variables or config."""
        damaged = []
        for name in (STATE_NPZ, STATE_PREV):
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                if name == STATE_NPZ:
                    damaged.append(f"checkpoint {path} is missing")
                continue
            try:
                saved = checkpoint.load_verified(path)
            except checkpoint.DamagedCheckpoint as e:
                damaged.append(str(e))
                continue
            if damaged:
                print(f"{damaged[0]}; falling back to {name}", file=sys.stderr)
            with self.strategy.scope():
                checkpoint.unpack(
                    path,
                    saved,
                    self._groups(),
                    refs=self._refs(),
                    config=checkpoint.config_hash(self.g, self.d),
                    optional=("g_scale", "d_scale"),
                )
            self.best = {
                k[len(_BEST) :]: v for k, v in saved.items() if k.startswith(_BEST)
            } or None
            if _STATE_KEY in saved:
                return json.loads(str(saved[_STATE_KEY]))
            return read_json(os.path.join(directory, STATE_JSON))
        unreadable = [reason for reason in damaged if not reason.endswith("is missing")]
        if unreadable:
            raise UsageError(unreadable[0] + "; no earlier checkpoint to fall back to")
        raise UsageError(f"no checkpoint in {directory}")


def _inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def has_checkpoint(directory):
    """state.npz or its previous copy (`restore` falls back to it); the JSON state is inside."""
    return any(os.path.exists(os.path.join(directory, f)) for f in (STATE_NPZ, STATE_PREV))
