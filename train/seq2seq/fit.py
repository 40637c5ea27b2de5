"""Compiling seq2seq training.

The loss, metric and schedule are defined in `zoo.seq2seq.objectives`, so that a
saved model's compile config loads wherever `zoo` is imported.
"""

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
