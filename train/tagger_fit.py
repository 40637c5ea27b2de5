"""Compile and fit a tagger with resumable checkpoints, best-on-dev weights, a time limit."""

import os
import time

import keras

from train.engine import averaged_weights
from train.rundir import atomic_save_model, atomic_write_json, read_json

LAST = "last.keras"
BEST = "best.weights.h5"
STATE = "state.json"


def compile_tagger(model, learning_rate, total_steps, warmup_steps, weight_decay,
                   ema_momentum=None):
    warmup_steps = max(0, min(warmup_steps, total_steps - 1))
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup_steps else learning_rate,
        decay_steps=max(1, total_steps - warmup_steps), alpha=0.05,
        warmup_target=learning_rate if warmup_steps else None, warmup_steps=warmup_steps)
    # With ema_momentum, dev evaluation and the saved model use the moving average of
    # the weights (Polyak averaging), which smooths out the last steps' noise.
    averaging = {"use_ema": True, "ema_momentum": ema_momentum} if ema_momentum else {}
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=weight_decay,
                                       clipnorm=1.0, **averaging)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")])


def read_state(checkpoint_dir):
    path = os.path.join(checkpoint_dir, STATE)
    if not os.path.exists(path):
        return {"epoch": 0, "best_val_acc": None, "best_epoch": None, "train_seconds": 0.0}
    return read_json(path)


class RunCheckpoint(keras.callbacks.Callback):
    """Each epoch: best-on-dev weights, the whole model (optimizer state too), state.json."""

    def __init__(self, checkpoint_dir, state):
        super().__init__()
        self.dir = checkpoint_dir
        self.state = dict(state)
        self.started = None

    def on_train_begin(self, logs=None):
        os.makedirs(self.dir, exist_ok=True)
        self.started = time.perf_counter()
        self.base_seconds = self.state["train_seconds"]

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        val = logs.get("val_acc")
        best = self.state["best_val_acc"]
        if val is not None and (best is None or val > best):
            self.state.update(best_val_acc=float(val), best_epoch=epoch + 1)
            tmp = os.path.join(self.dir, ".tmp-" + BEST)
            try:
                with averaged_weights(self.model):
                    self.model.save_weights(tmp)
                os.replace(tmp, os.path.join(self.dir, BEST))
            finally:  # a failed write (a full disk) leaves no partial file
                if os.path.exists(tmp):
                    os.unlink(tmp)
        self.state["epoch"] = epoch + 1
        self.state.setdefault("history", []).append(
            {"epoch": epoch + 1, **{k: round(float(v), 5) for k, v in logs.items()
                                    if isinstance(v, (int, float))}})
        self.state["train_seconds"] = self.base_seconds + time.perf_counter() - self.started
        atomic_save_model(self.model, os.path.join(self.dir, LAST))
        atomic_write_json(os.path.join(self.dir, STATE), self.state)


class TimeLimit(keras.callbacks.Callback):
    """Stops training once the run (resumed parts included) has used its time budget."""

    def __init__(self, seconds, already_used=0.0):
        super().__init__()
        self.seconds = seconds
        self.already_used = already_used
        self.stopped_early = False

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.seconds and self.already_used + time.perf_counter() - self.started > self.seconds:
            self.model.stop_training = True
            self.stopped_early = True
