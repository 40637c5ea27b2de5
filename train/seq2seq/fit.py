"""Compiling seq2seq training.

The loss, metric and inverse-sqrt schedule are defined in `zoo.seq2seq.objectives`
(the cosine one is Keras's), so that a saved model's compile config loads wherever
`zoo` is imported.
"""

import keras

from zoo.seq2seq.objectives import MaskedAccuracy, MaskedSmoothedCrossEntropy, WarmupInverseSqrt


def learning_rate(peak_lr, warmup_steps, schedule="inverse_sqrt", total_steps=None):
    """A linear warm-up to `peak_lr`, then inverse-sqrt decay or ("cosine") a cosine
    down to zero at `total_steps`."""
    if schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(
            0.0,
            max(1, total_steps - warmup_steps),
            warmup_target=peak_lr,
            warmup_steps=warmup_steps,
        )
    return WarmupInverseSqrt(peak_lr, warmup_steps)


def compile_seq2seq(
    model,
    peak_lr,
    warmup_steps,
    label_smoothing,
    jit_compile,
    schedule="inverse_sqrt",
    total_steps=None,
    ema_momentum=None,
):
    # With ema_momentum, dev evaluation and the saved model use the moving average of
    # the weights (train.engine.averaged_weights).
    averaging = {"use_ema": True, "ema_momentum": ema_momentum} if ema_momentum else {}
    optimizer = keras.optimizers.Adam(
        learning_rate=learning_rate(peak_lr, warmup_steps, schedule, total_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        clipnorm=1.0,
        **averaging,
    )
    model.compile(
        optimizer=optimizer,
        loss=MaskedSmoothedCrossEntropy(label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=jit_compile,
    )
