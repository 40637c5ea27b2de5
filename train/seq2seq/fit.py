"""Compiling seq2seq training.

The loss, metric and inverse-sqrt schedule are defined in `zoo.seq2seq.objectives`,
so that a saved model's compile config loads wherever `zoo` is imported; the cosine
schedule is the training step's (`train.engine.warmup_cosine`), as it follows the
budget's progress rather than the optimizer's step count.
"""

import keras

from train import engine
from zoo.seq2seq.objectives import MaskedAccuracy, MaskedSmoothedCrossEntropy, WarmupInverseSqrt


def learning_rate(peak_lr, warmup_steps, schedule="inverse_sqrt", total_steps=None):
    """(the optimizer's learning rate, the step's `rate` or None): a linear warm-up to
    `peak_lr`, then inverse-sqrt decay (a schedule of the optimizer's step count) or
    ("cosine") a cosine down to zero at the end of the budget: `total_steps`, or the
    time budget's end, whichever comes first (`train.engine.warmup_cosine`)."""
    if schedule == "cosine":
        return peak_lr, engine.warmup_cosine(peak_lr, warmup_steps, total_steps)
    return WarmupInverseSqrt(peak_lr, warmup_steps), None


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
    """Compiles `model`; returns the training step's `rate` (None: the optimizer's own
    schedule)."""
    # With ema_momentum, dev evaluation and the saved model use the moving average of
    # the weights (train.engine.averaged_weights).
    compiled, rate = learning_rate(peak_lr, warmup_steps, schedule, total_steps)
    averaging = {"use_ema": True, "ema_momentum": ema_momentum} if ema_momentum else {}
    optimizer = keras.optimizers.Adam(
        learning_rate=compiled,
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
    return rate
