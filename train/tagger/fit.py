"""The tagger's optimizer and loss: AdamW on a warm-up + cosine schedule, optional
weight averaging, masked accuracy."""

import keras

from train import engine


def compile_tagger(
    model, learning_rate, total_steps, warmup_steps, weight_decay, ema_momentum=None
):
    """Compiles `model`; returns its learning rate at each step's `train.engine.At` (the
    step's `rate`: a warm-up, then a cosine to 5% of `learning_rate` at the end of the
    budget, steps or clock). Without that rate the optimizer keeps `learning_rate`."""
    # With ema_momentum, dev evaluation and the saved model use the moving average of
    # the weights (Polyak averaging), which smooths out the last steps' noise.
    averaging = {"use_ema": True, "ema_momentum": ema_momentum} if ema_momentum else {}
    optimizer = keras.optimizers.AdamW(
        learning_rate=learning_rate, weight_decay=weight_decay, clipnorm=1.0, **averaging
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return engine.warmup_cosine(learning_rate, warmup_steps, total_steps, alpha=0.05)
