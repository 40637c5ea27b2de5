"""Run directories: the creation rules of the train commands (written with zoo.atomic).

A run directory holds what one training run wrote (README, "Models and command lines"). The CLIs
refuse to write into a directory that holds something else, and never overwrite a
finished run unless asked to continue it (--resume).
"""

import dataclasses
import os

from zoo import atomic
from zoo import run_lock as runlock
from zoo.cli import UsageError
from zoo.rundir import MARKER, is_run_dir, load_json, run_kind


def check_out_dir(path, resume, kinds):
    """Validates --out before anything is written, and locks it when it exists.

    `kinds`: the run kinds this command can --resume; a run of another kind is refused
    here, before TensorFlow is imported.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--out exists and is not a directory: {path}")
    if not os.path.exists(path):
        if resume:
            raise UsageError(f"--resume: run directory not found: {path}")
        runlock.check_writable_ancestor(path, "--out", creating=True)
        return
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out is not writable: {path}")
    runlock.refuse_if_held(path)
    if not [name for name in os.listdir(path) if name != runlock.LOCK_NAME]:
        if resume:
            raise UsageError(f"--resume: nothing to resume in empty directory: {path}")
        runlock.acquire(path)  # released when the CLI ends
        return
    if not is_run_dir(path):
        raise UsageError(
            f"--out exists and is not a run directory (refusing to write into it): {path}"
        )
    if not resume:
        raise UsageError(
            f"--out already holds a run: {path} (use --resume to continue it, or another --out)"
        )
    found = run_kind(path, strict=False)
    if kinds and found is not None and found not in kinds:
        raise UsageError(
            f"--resume: {path} is a {found!r} run, not {' or '.join(repr(k) for k in kinds)}"
        )
    runlock.acquire(path)


def prepare(cfg, kinds, load):
    """Checks --out and reads a new run's data (None for --resume) before anything is
    written or Keras imported (then it is), so that bad input is one line."""
    check_out_dir(cfg.out, resume=cfg.resume, kinds=kinds)
    data = None if cfg.resume else load(cfg)
    from zoo.cli import import_keras_quietly

    import_keras_quietly()
    return data


def create_run_dir(path, kind):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the run directory {path}: {e.strerror}") from None
    runlock.acquire(path)
    marker = os.path.join(path, MARKER)
    if not os.path.exists(marker):
        atomic.write_text(marker, kind + "\n")


def resumed(cfg, kinds):
    """(config.json, the options to continue with) of the run `cfg.out` to --resume, once
    it is known to hold step checkpoints; `kinds` are the run kinds the command
    continues (the first names them). The options declared `resume` (--epochs, --verbose,
    seq2seq's --average-last) as given now, the rest as recorded (config.from_record: a
    section of other fields is refused); a flag typed to change another recorded option
    is refused, not dropped without a word."""
    from train import checkpoint, config

    out = cfg.out
    config_path = os.path.join(out, "config.json")
    ckpt_dir = os.path.join(out, "checkpoints")
    if not os.path.exists(config_path) or not checkpoint.list_checkpoints(ckpt_dir):
        raise UsageError(
            f"--resume: no checkpoint to resume in {out} (missing config.json or checkpoints/)"
        )
    run_config = load_json(config_path)
    if run_config.get("kind") not in kinds:
        raise UsageError(
            f"--resume: {out} is not a {kinds[0]} run (kind={run_config.get('kind')!r})"
        )
    recorded = config.from_record(type(cfg), run_config.get("train"), config_path)
    now = {f.name for f in dataclasses.fields(cfg) if f.metadata["resume"]}
    typed = getattr(cfg, "typed_flags", {})  # none for a config built in code
    changed = [
        typed[name]
        for name, value in config.record(cfg).items()
        if name in typed and name not in now and value != getattr(recorded, name)
    ]
    if changed:
        *others, last = [config.flag(f) for f in dataclasses.fields(cfg) if f.name in now]
        allowed = f"{', '.join(others)} and {last}" if others else last
        raise UsageError(
            f"--resume continues {out} with its recorded options: {', '.join(changed)} would "
            f"change them (only {allowed} can; or start a new run)"
        )
    for name in now:
        if getattr(cfg, name) is not None:
            setattr(recorded, name, getattr(cfg, name))
    return run_config, recorded


def save_resumed(out, run_config, train_cfg, context):
    """Rewrites config.json with the options and the runtime the resumed part trains with
    (`context`: the command's train.strategy.RunContext)."""
    run_config["train"] = train_cfg
    run_config["runtime"] = context.runtime()
    atomic.write_json(os.path.join(out, "config.json"), run_config)
