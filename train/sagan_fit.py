"""The SAGAN training step: hinge loss, TTUR, n_dis, EMA of G, resumable state.

One D step uses one real batch and one generated batch (concatenated, so D's
spectral-norm vectors move once per step); every `n_dis` D steps, one G step.
Losses (Lim and Ye, 2017; as in SAGAN):
    L_D = E[relu(1 - D(x, y))] + E[relu(1 + D(G(z, y'), y'))]
    L_G = -E[D(G(z, y'), y')]
with y' drawn uniformly from the classes. Adam(beta_1=0, beta_2=0.9) with
lr_D 4e-4 and lr_G 1e-4 (TTUR) by default.

The whole training state (G, D, EMA-G variables and both optimizers' slots) is
saved as one .npz written atomically, plus `state.json`; `restore` puts it back
into freshly built models, so `--resume` continues where the run stopped.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from train.rundir import atomic_save_npz, atomic_write_json, read_json

STATE_NPZ = "state.npz"
STATE_JSON = "state.json"


class SaganTrainer:
    def __init__(self, generator, discriminator, *, num_classes, latent_dim, lr_g=1e-4,
                 lr_d=4e-4, beta_1=0.0, beta_2=0.9, n_dis=1, ema=None, ema_decay=0.999):
        self.g, self.d, self.ema = generator, discriminator, ema
        self.num_classes = num_classes
        self.latent_dim = latent_dim
        self.n_dis = n_dis
        self.ema_decay = ema_decay
        self.g_opt = keras.optimizers.Adam(lr_g, beta_1=beta_1, beta_2=beta_2)
        self.d_opt = keras.optimizers.Adam(lr_d, beta_1=beta_1, beta_2=beta_2)
        self.g_opt.build(self.g.trainable_variables)
        self.d_opt.build(self.d.trainable_variables)
        self.d_step = tf.function(self._d_step, reduce_retracing=True)
        self.g_step = tf.function(self._g_step, reduce_retracing=True)
        self.ema_step = tf.function(self._ema_step)

    # ------------------------------------------------------------ steps
    def _g_inputs(self, noise, labels):
        return {"noise": noise, "label": labels} if self.num_classes else {"noise": noise}

    def _d_inputs(self, images, labels):
        return {"image": images, "label": labels} if self.num_classes else {"image": images}

    def _sample_latents(self, batch):
        noise = tf.random.normal((batch, self.latent_dim))
        labels = tf.random.uniform((batch,), 0, max(self.num_classes or 1, 1), dtype=tf.int32)
        return noise, labels

    def _d_step(self, real, labels):
        batch = tf.shape(real)[0]
        noise, fake_labels = self._sample_latents(batch)
        fake = self.g(self._g_inputs(noise, fake_labels), training=True)
        images = tf.concat([real, fake], axis=0)
        all_labels = tf.concat([labels, fake_labels], axis=0)
        with tf.GradientTape() as tape:
            logits = self.d(self._d_inputs(images, all_labels), training=True)
            real_logits, fake_logits = logits[:batch], logits[batch:]
            loss_real = tf.reduce_mean(tf.nn.relu(1.0 - real_logits))
            loss_fake = tf.reduce_mean(tf.nn.relu(1.0 + fake_logits))
            loss = loss_real + loss_fake
        grads = tape.gradient(loss, self.d.trainable_variables)
        self.d_opt.apply(grads, self.d.trainable_variables)
        return loss, tf.reduce_mean(real_logits), tf.reduce_mean(fake_logits)

    def _g_step(self, batch):
        noise, labels = self._sample_latents(batch)
        with tf.GradientTape() as tape:
            fake = self.g(self._g_inputs(noise, labels), training=True)
            loss = -tf.reduce_mean(self.d(self._d_inputs(fake, labels), training=True))
        grads = tape.gradient(loss, self.g.trainable_variables)
        self.g_opt.apply(grads, self.g.trainable_variables)
        return loss

    def _ema_step(self, step):
        # Warm-up: early on the average follows G closely (decay ~ (1+t)/(10+t)).
        step = tf.cast(step, tf.float32)
        decay = tf.minimum(self.ema_decay, (1.0 + step) / (10.0 + step))
        for target, source in zip(self.ema.variables, self.g.variables):
            if "float" in str(target.dtype):
                target.assign(decay * target + (1.0 - decay) * source)

    def train_batch(self, real, labels, d_steps_done):
        """One D step, and a G step (+ EMA) when it is G's turn. Returns logs."""
        d_loss, real_logit, fake_logit = self.d_step(tf.constant(real), tf.constant(labels))
        logs = {"d_loss": float(d_loss), "d_real": float(real_logit), "d_fake": float(fake_logit)}
        if (d_steps_done + 1) % self.n_dis == 0:
            logs["g_loss"] = float(self.g_step(tf.constant(len(real), tf.int32)))
            if self.ema is not None:
                self.ema_step(tf.constant(self.g_opt.iterations.numpy(), tf.int64))
        return logs

    # ------------------------------------------------------------ state
    def _groups(self):
        groups = {"g": self.g.variables, "d": self.d.variables,
                  "g_opt": self.g_opt.variables, "d_opt": self.d_opt.variables}
        if self.ema is not None:
            groups["ema"] = self.ema.variables
        return groups

    def save(self, directory, state):
        os.makedirs(directory, exist_ok=True)
        arrays = {f"{name}/{i}": np.asarray(v.numpy())
                  for name, variables in self._groups().items() for i, v in enumerate(variables)}
        atomic_save_npz(os.path.join(directory, STATE_NPZ), **arrays)
        atomic_write_json(os.path.join(directory, STATE_JSON), state)

    def restore(self, directory):
        with np.load(os.path.join(directory, STATE_NPZ)) as saved:
            for name, variables in self._groups().items():
                count = sum(1 for k in saved.files if k.startswith(name + "/"))
                if count != len(variables):
                    raise ValueError(f"checkpoint holds {count} {name} variables, the model {len(variables)}")
                for i, v in enumerate(variables):
                    v.assign(saved[f"{name}/{i}"])
        return read_json(os.path.join(directory, STATE_JSON))


def has_checkpoint(directory):
    return all(os.path.exists(os.path.join(directory, f)) for f in (STATE_NPZ, STATE_JSON))
