"""Compiling and callbacks of seq2seq training.

The loss, metric and schedule are defined in `zoo.seq2seq.objectives`, so that a
saved model's compile config loads wherever `zoo` is imported.
"""

import math
import sys
import time

import keras

from zoo.seq2seq.objectives import MaskedAccuracy, MaskedSmoothedCrossEntropy, WarmupInverseSqrt


def compile_seq2seq(model, peak_lr, warmup_steps, label_smoothing, jit_compile):
    optimizer = keras.optimizers.Adam(
        learning_rate=WarmupInverseSqrt(peak_lr, warmup_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        clipnorm=1.0,
    )
    model.compile(
        optimizer=optimizer,
        loss=MaskedSmoothedCrossEntropy(label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=jit_compile,
    )


class DevScore(keras.callbacks.Callback):
    """Each epoch: decodes a dev sample and logs its score (BLEU or exact match),
    so a run shows its task metric rising, on stdout and in TensorBoard."""

    def __init__(self, score_fn, name, log_dir):
        super().__init__()
        self.score_fn = score_fn
        self.name = name
        self.writer = None
        self.log_dir = log_dir
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf

        started = time.perf_counter()
        value = float(self.score_fn())
        self.history.append({"epoch": epoch + 1, self.name: round(value, 4)})
        if logs is not None:
            logs[f"val_{self.name}"] = value
        if self.writer is None:
            self.writer = tf.summary.create_file_writer(f"{self.log_dir}/dev_score")
        with self.writer.as_default():
            tf.summary.scalar(self.name, value, step=epoch + 1)
        print(
            f"  epoch {epoch + 1}: dev {self.name} {value:.2f} "
            f"({time.perf_counter() - started:.0f}s to decode)",
            file=sys.stderr,
            flush=True,
        )


def estimated_steps(examples, batch_size, epochs):
    return max(1, math.ceil(examples / batch_size)) * max(1, epochs)
