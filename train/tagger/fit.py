"""The tagger's optimizer and loss: AdamW on a warm-up + cosine schedule, optional
weight averaging, masked accuracy."""

import keras


def compile_tagger(
    model, learning_rate, total_steps, warmup_steps, weight_decay, ema_momentum=None
):
    warmup_steps = max(0, min(warmup_steps, total_steps - 1))
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup_steps else learning_rate,
        decay_steps=max(1, total_steps - warmup_steps),
        alpha=0.05,
        warmup_target=learning_rate if warmup_steps else None,
        warmup_steps=warmup_steps,
    )
    # With ema_momentum, dev evaluation and the saved model use the moving average of
    # the weights (Polyak averaging), which smooths out the last steps' noise.
    averaging = {"use_ema": True, "ema_momentum": ema_momentum} if ema_momentum else {}
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule, weight_decay=weight_decay, clipnorm=1.0, **averaging
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
