"""Keras callbacks and checkpoint files every Keras-fit training command shares (the
tagger's and seq2seq's).

`RunCheckpoint` writes `last.keras` and `best.weights.h5` with a checksum record each
and keeps the copies they replace (train.checkpoint's checked files: `last.prev.keras`,
`best.prev.weights.h5`); `recover` checks them before --resume reads them and falls
back to the previous copy of a damaged one, saying so. `resumable_config` is --resume's
first step: the run's config.json, once its checkpoints are known to be there.
"""

import os
import sys
import time

import keras

from train import checkpoint, engine, rundir
from train.engine import averaged_weights
from train.rundir import read_json
from zoo import atomic
from zoo.cli import UsageError

LAST = "last.keras"
BEST = "best.weights.h5"
STATE = "state.json"


def resumable_config(out, kinds, what):
    """The config.json of the run `out` to --resume (its damaged checkpoint files
    replaced by their previous copies first); `kinds` are the run kinds the command
    continues, `what` names them in the refusal."""
    config_path = os.path.join(out, "config.json")
    ckpt_dir = os.path.join(out, "checkpoints")
    last = os.path.join(ckpt_dir, LAST)
    if os.path.isdir(ckpt_dir) and os.path.exists(config_path):
        recover(ckpt_dir)  # a damaged last.keras or best weights: their previous copies
    step_checkpoint = checkpoint.latest(ckpt_dir)[1] if os.path.isdir(ckpt_dir) else None
    if not os.path.exists(config_path) or not (os.path.exists(last) or step_checkpoint):
        raise UsageError(
            f"--resume: no checkpoint to resume in {out} (missing config.json or checkpoints/{LAST})"
        )
    config = rundir.read_json(config_path)
    if config.get("kind") not in kinds:
        raise UsageError(f"--resume: {out} is not a {what} run (kind={config.get('kind')!r})")
    return config


def read_state(checkpoint_dir):
    path = os.path.join(checkpoint_dir, STATE)
    if not os.path.exists(path):
        return {"epoch": 0, "best_val_acc": None, "best_epoch": None, "train_seconds": 0.0}
    try:
        return read_json(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UsageError(
            f"{path} cannot be read ({type(e).__name__}); no copy to fall back to"
        ) from None


def recover(checkpoint_dir):
    """Before --resume reads the run's checkpoint files: `last.keras` and
    `best.weights.h5` are checked against their records; a damaged one is replaced by
    its previous copy (one line on stderr each), and state.json is written again from
    the state recorded with the `last.keras` in place (after a fallback: the previous
    epoch's; the best weights' epoch and accuracy from the copy in place). No good
    copy: train.checkpoint.DamagedCheckpoint (exit 2, one line)."""
    paths = [os.path.join(checkpoint_dir, name) for name in (LAST, BEST)]
    (last, last_why), (best, best_why) = [checkpoint.checked(p) for p in paths]  # before any change
    for path, why in zip(paths, (last_why, best_why)):
        if why is not None:
            checkpoint.fall_back(path, why)
    last_fell_back, best_fell_back = last_why is not None, best_why is not None
    if not (last or best):  # a run from before the records: as it is
        return
    state_path = os.path.join(checkpoint_dir, STATE)
    state = None
    if last and last.get("state") is not None:
        state = dict(last["state"])
    elif os.path.exists(state_path):
        state = read_state(checkpoint_dir)
    if state is None:
        return
    if best_fell_back or (
        best
        and state.get("best_epoch") is not None
        and best.get("best_epoch") != state.get("best_epoch")
    ):
        # The best weights in place are another epoch's than the state says (a fallback,
        # or a crash between the two writes): the state follows the weights.
        state.update(best_val_acc=best.get("best_val_acc"), best_epoch=best.get("best_epoch"))
    if last_fell_back or best_fell_back or _differs(state_path, state):
        atomic.write_json(state_path, state)


def _differs(path, state):
    try:
        return read_json(path) != state
    except (OSError, ValueError, UnicodeDecodeError):
        return True


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

            def write_best(tmp):
                with averaged_weights(self.model):
                    self.model.save_weights(tmp)

            # A failed write (a full disk) leaves no partial file and the previous copy.
            checkpoint.save_checked(
                os.path.join(self.dir, BEST),
                write_best,
                meta={"best_val_acc": float(val), "best_epoch": epoch + 1},
            )
        self.state["epoch"] = epoch + 1
        self.state.setdefault("history", []).append(
            {
                "epoch": epoch + 1,
                **{k: round(float(v), 5) for k, v in logs.items() if isinstance(v, (int, float))},
            }
        )
        self.state["train_seconds"] = self.base_seconds + time.perf_counter() - self.started
        checkpoint.save_checked(
            os.path.join(self.dir, LAST), self.model.save, meta={"state": self.state}
        )
        atomic.write_json(os.path.join(self.dir, STATE), self.state)


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


def fit_resumable(
    model,
    train_batches,
    dev_batches,
    out,
    train_cfg,
    state,
    verbose,
    announce=None,
    first=(),
    **fit_kwargs,
):
    """`engine.fit` from `state`'s epoch to train_cfg["epochs"] with the run's checkpoint,
    time limit and TensorBoard callbacks (after the `first` ones), then the best-on-dev
    weights restored. Returns the final state and whether the time limit ended the run."""
    ckpt_dir = os.path.join(out, "checkpoints")
    run_checkpoint = RunCheckpoint(ckpt_dir, state)
    limit = TimeLimit(train_cfg["max_minutes"] * 60.0, state["train_seconds"])
    callbacks = [
        *first,
        run_checkpoint,
        limit,
        keras.callbacks.TensorBoard(os.path.join(out, "logs"), write_graph=False, profile_batch=0),
    ]
    epochs = train_cfg["epochs"]
    if state["epoch"] < epochs:
        engine.fit(
            model,
            train_batches,
            validation_data=dev_batches,
            epochs=epochs,
            initial_epoch=state["epoch"],
            epochs_done=state["epoch"],
            callbacks=callbacks,
            verbose=verbose,
            checkpoint_dir=ckpt_dir,
            announce=announce,
            **fit_kwargs,
        )
    elif announce:
        print(announce, file=sys.stderr)
    state = run_checkpoint.state if run_checkpoint.started else state
    best = os.path.join(ckpt_dir, BEST)
    if os.path.exists(best):
        model.load_weights(best)
    return state, limit.stopped_early
