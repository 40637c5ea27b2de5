"""One SAGAN run (train, resume) and --compare, writing the run-directory contract.

RUN_DIR/model.keras          the generator (EMA weights when --ema > 0)
RUN_DIR/discriminator.keras  the discriminator
RUN_DIR/classifier.keras     the frozen evaluation classifier (FID/KID feature space)
RUN_DIR/config.json          kind "sagan", generator kwargs under "model", "train", "data"
RUN_DIR/metrics.json         fid, kid, fid_floor, kid_floor, class_accuracy, ...
RUN_DIR/calibration.npz      noise (and label) rows for int8 calibration of the export
RUN_DIR/vocab/classes.txt    class names, one per line (label id = line number)
RUN_DIR/samples/epoch_NNN.png, samples.png, attention.png, logs/ (TensorBoard),
RUN_DIR/checkpoints/         step and best checkpoints (train.checkpoint: resume), and
                             the classifier's
"""

import dataclasses
import os
import sys
import time
import types
import typing

import keras
import numpy as np

from train import config, engine, rundir
from train.progress import markdown_table, mean_and_std
from train.sagan.evaluation import Evaluator
from train.sagan.fid_classifier import get_classifier
from train.sagan.figures import save_attention_figure, save_progress_figure, save_sample_grid
from train.sagan.images import load_images
from train.steps import float32_model, make_sagan_step
from zoo import atomic
from zoo.cli import UsageError
from zoo.sagan.model import (
    attention_scores,
    build_discriminator,
    build_generator,
    resolve_attention,
)

SUMMARY_COLUMNS = [
    ("name", "run"),
    ("fid", "FID"),
    ("fid_floor", "FID floor"),
    ("kid", "KID"),
    ("class_accuracy", "class acc"),
    ("consistent", "consistent"),
    ("params_g", "G params"),
    ("train_seconds", "train s"),
    ("epochs", "epochs"),
]
DEFAULT_EPOCHS = 100
# The default training budget, and the whole default run's: on a CPU where the data and
# the classifier take minutes, 12 minutes of training would end the run past 15.
DEFAULT_MAX_MINUTES = 12.0
RUN_MINUTES = 14.0
MIN_MINUTES = 1.0
GRID_COLUMNS = 8


def _configs(cfg, data):
    """config.json's "model" (the generator's arguments) and "train": the options with
    the epochs, the data seed (--data-seed, else --seed: --compare trains several model
    seeds on one data set) and the run's attention resolved, so replaying it trains the
    same run."""
    conditional = data.num_classes > 1 and not cfg.unconditional
    attention = resolve_attention(data.image_size, cfg.attention())
    model_cfg = {
        "image_size": data.image_size,
        "channels": data.channels,
        "num_classes": data.num_classes if conditional else None,
        "latent_dim": cfg.latent_dim,
        "width": cfg.width,
        "attention_resolution": attention,
        "seed": cfg.seed,
        "class_embedding": cfg.class_embedding if conditional else 0,
    }
    resolved = dataclasses.replace(
        cfg,
        epochs=DEFAULT_EPOCHS if cfg.epochs is None else cfg.epochs,
        data_seed=cfg.resolved_data_seed(),
        attention_resolution="none" if attention is None else str(attention),
    )
    return model_cfg, config.record(resolved)


def _d_config(model_cfg):
    return {k: v for k, v in model_cfg.items() if k not in ("latent_dim", "class_embedding")}


def _build(context, model_cfg, train_cfg):
    """G, D and EMA-G, built in the scope of the run's strategy (its `context`)."""
    # The builders themselves, not zoo.build: that imports every zoo model, TensorFlow
    # with the tagger's, and the JAX benchmark builds these where TensorFlow is absent.
    with context.scope():
        try:
            g = build_generator(**model_cfg)
            d = build_discriminator(**_d_config(model_cfg))
        except ValueError as e:
            raise UsageError(str(e)) from None
        ema = None
        if train_cfg["ema"] > 0:
            ema = build_generator(**model_cfg)
            ema.set_weights(g.get_weights())
    return g, d, ema


def _sampler(context, source, model_cfg):
    """A function returning the model that makes images for FID, figures and model.keras:
    the generator on one device, else a one-device copy refreshed from it at each call
    (`predict_on_batch` on a mirrored model runs the whole batch on every replica)."""
    import tensorflow as tf

    with context.scope():
        if not tf.distribute.has_strategy():
            return lambda: source
    model = build_generator(**model_cfg)

    def refresh():
        model.set_weights(source.get_weights())
        return model

    return refresh


def check_replicas(context, batch_size):
    """--batch-size is the global batch: every replica needs at least one row of it."""
    replicas = int(context.strategy.num_replicas_in_sync)
    if batch_size < replicas:
        raise UsageError(
            f"--batch-size must be >= the number of replicas ({replicas}), got {batch_size}"
        )


def default_budget(elapsed_minutes):
    """Training minutes of a default run that has taken `elapsed_minutes` so far:
    DEFAULT_MAX_MINUTES, or what is left of RUN_MINUTES (at least MIN_MINUTES)."""
    return max(MIN_MINUTES, min(DEFAULT_MAX_MINUTES, RUN_MINUTES - elapsed_minutes))


def _resolve_budget(context, started, train_cfg):
    """Sets train_cfg["max_minutes"] where --max-minutes was not given (None); True when
    it did. `started`: when the run began (None: no default budget to cut). Several
    workers get DEFAULT_MAX_MINUTES: each one's clock would give its own."""
    if train_cfg["max_minutes"] is not None:
        return False
    if started is None or context.worker()[1] > 1:
        train_cfg["max_minutes"] = DEFAULT_MAX_MINUTES
        return True
    elapsed = (time.monotonic() - started) / 60.0
    budget = round(default_budget(elapsed), 2)
    train_cfg["max_minutes"] = budget
    if budget < DEFAULT_MAX_MINUTES:
        print(
            f"training for {budget:g} minutes, not {DEFAULT_MAX_MINUTES:g}: data and "
            f"classifier took {elapsed:.1f}, and the run ends within {RUN_MINUTES:g} "
            "(--max-minutes sets it)",
            file=sys.stderr,
            flush=True,
        )
    return True


def train_one(context, cfg, data, out, classifier=None, started=None):
    """One run of `cfg` (train.sagan.SaganConfig) in `context`; `started`: when it began."""
    keras.utils.set_random_seed(cfg.seed)
    model_cfg, train_cfg = _configs(cfg, data)
    models = _build(context, model_cfg, train_cfg)
    rundir.create_run_dir(out, "sagan")
    atomic.write_lines(os.path.join(out, "vocab", "classes.txt"), data.class_names)
    run_config = {
        "kind": "sagan",
        "model": model_cfg,
        "discriminator": _d_config(model_cfg),
        "train": train_cfg,
        "data": data.source,
        "class_names": list(data.class_names),
        "runtime": context.runtime(),
    }
    atomic.write_json(os.path.join(out, "config.json"), run_config)
    classifier, report = get_classifier(out, data, train_cfg, classifier)
    if _resolve_budget(context, started, train_cfg):
        atomic.write_json(os.path.join(out, "config.json"), run_config)  # resume reads it
    run = _Run(context, out, run_config, data, models, classifier, report)
    return _fit_and_finish(run, resuming=False)


def resume_run(context, cfg):
    out = cfg.out
    # A run has step checkpoints once its budget is set in config.json (_resolve_budget).
    run_config, recorded = rundir.resumed(cfg, ("sagan",))
    train_cfg = config.record(recorded)
    check_replicas(context, train_cfg["batch_size"])
    data = load_images(recorded)
    keras.utils.set_random_seed(train_cfg["seed"])
    models = _build(context, run_config["model"], train_cfg)
    classifier, report = get_classifier(out, data, train_cfg)
    rundir.save_resumed(out, run_config, train_cfg, context)
    run = _Run(context, out, run_config, data, models, classifier, report)
    return _fit_and_finish(run, resuming=True)


def _step(context, models, model_cfg, train_cfg):
    shape = {k: model_cfg[k] for k in ("num_classes", "latent_dim")}
    recipe = types.SimpleNamespace(**{**train_cfg, **shape})
    step = make_sagan_step(models, recipe, context, context.jit_compile)
    if context.jit_compile and not step.jit_compile:
        print(
            f"XLA: off for sagan on {step.replicas} replicas (an XLA computation runs on one "
            f"device; docs/distributed.md)",
            file=sys.stderr,
        )
    return step


CLASS_FLOOR = 0.9


def best_key(logs):
    """`Plan.best` of --keep best: the lowest quick FID among the epochs whose worst class
    is recognised in >= CLASS_FLOOR of the quick evaluation's images, else of all epochs:
    GAN runs swing late, and FID alone can keep an epoch that lost a class (benchmarks/sagan.md)."""
    fid, worst = logs.get("fid_quick"), logs.get("class_min_quick")
    if fid is None:
        return None
    return [0 if worst is None or worst >= CLASS_FLOOR else 1, fid]  # None: unconditional


def _fixed_latents(model_cfg, seed):
    """The sample grids' inputs: a row per class (at most 10) over the same GRID_COLUMNS
    noises, or unconditional, GRID_COLUMNS rows of other noises."""
    num_classes, latent_dim = model_cfg["num_classes"], model_cfg["latent_dim"]
    rng = np.random.default_rng(seed + 12345)
    noise = rng.standard_normal((GRID_COLUMNS, latent_dim)).astype(np.float32)
    if not num_classes:
        return {"noise": rng.standard_normal((GRID_COLUMNS**2, latent_dim)).astype(np.float32)}
    rows = min(num_classes, 10)
    return {
        "noise": np.tile(noise, (rows, 1)),
        "label": np.repeat(np.arange(rows), GRID_COLUMNS).astype(np.int32),
    }


class _Run(typing.NamedTuple):
    """What one SAGAN run trains and evaluates with."""

    context: object  # the command's train.strategy.RunContext
    out: str
    config: dict
    data: object
    models: tuple  # (G, D, EMA-G or None)
    classifier: object
    report: dict


class _Batches:
    """The real images of one epoch, in the order (seed, epoch) gives, as batches of
    (images in [-1, 1], labels); the last partial batch is dropped."""

    def __init__(self, data, batch, order, conditional):
        self.data, self.batch, self.order, self.conditional = data, batch, order, conditional

    def __len__(self):
        return max(1, len(self.data.train) // self.batch)

    def __iter__(self):
        for i in range(len(self)):
            idx = self.order[i * self.batch : (i + 1) * self.batch]
            real = self.data.train[idx].astype(np.float32) / 127.5 - 1.0
            labels = self.data.train_labels[idx] if self.conditional else np.zeros(len(idx))
            yield real, labels.astype(np.int32)


def _fit_and_finish(run, resuming):
    g, d, ema = run.models
    model_cfg, train_cfg = run.config["model"], run.config["train"]
    step = _step(run.context, run.models, model_cfg, train_cfg)
    # What the steps really run with: SAGAN's are not XLA-compiled on several replicas
    # even when --jit-compile (or a GPU's default) asks for it.
    step.runtime = {**run.context.runtime(), "jit_compile": step.jit_compile}
    if run.config["runtime"] != step.runtime:
        run.config["runtime"] = step.runtime
        atomic.write_json(os.path.join(run.out, "config.json"), run.config)
    sampling = _sampler(run.context, ema if ema is not None else g, model_cfg)
    seed, samples = train_cfg["seed"], train_cfg["epoch_eval_samples"]
    quick = samples and Evaluator(
        run.classifier, run.data, samples, train_cfg["data_seed"], model_cfg
    )
    fixed = _fixed_latents(model_cfg, seed)
    os.makedirs(os.path.join(run.out, "samples"), exist_ok=True)
    state = {}

    def quick_eval():
        return quick.evaluate(sampling(), seed + 7, quick=True) if quick else {"fid_quick": None}

    def epoch_end(epoch, logs):
        # The quick evaluation joins the epoch's logs, which pick the best epoch.
        logs.update(quick_eval())
        grid = os.path.join(run.out, "samples", f"epoch_{epoch + 1:03d}.png")
        save_sample_grid(sampling().predict_on_batch(fixed), GRID_COLUMNS, grid)
        if run.context.is_chief():
            history = state["history"] + [{"epoch": epoch + 1, **logs}]
            save_progress_figure(history, os.path.join(run.out, "progress.png"))

    if not resuming:  # a resumed run's checkpoint holds it
        state["initial_fid"] = quick_eval()["fid_quick"]
    plan = engine.run_plan(
        run.context,
        run.out,
        train_cfg,
        best=best_key if train_cfg["keep"] == "best" else None,
        hooks=(epoch_end,),
    )
    batch, conditional = train_cfg["batch_size"], bool(model_cfg["num_classes"])

    def source(epoch):
        order = np.random.default_rng(seed + epoch).permutation(len(run.data.train))
        return _Batches(run.data, batch, order, conditional)

    engine.fit(step, source, plan, state, name=run.out)
    sampler = float32_model(sampling())
    best = state.get("best")
    if best is not None:
        worst = best["logs"].get("class_min_quick")
        which = (
            f"every class >= {CLASS_FLOOR:.0%}, the lowest FID of such epochs"
            if worst is not None and worst >= CLASS_FLOOR
            else "the lowest of the run"
        )
        print(
            f"keeping the generator of epoch {best['epoch']} (quick FID "
            f"{best['logs']['fid_quick']}, {which})",
            file=sys.stderr,
            flush=True,
        )
    return _finish(run, sampler, state, fixed)


def _finish(run, sampler, state, fixed):
    out, data = run.out, run.data
    (g, d, _), model_cfg, train_cfg = run.models, run.config["model"], run.config["train"]
    samples, seed = train_cfg["eval_samples"], train_cfg["data_seed"]
    evaluator = Evaluator(run.classifier, data, samples, seed, model_cfg)
    metrics = evaluator.evaluate(sampler, seed=train_cfg["seed"] + 1)
    seconds, history = state["train_seconds"], state["history"]
    runtime = run.config["runtime"]  # set by _fit_and_finish: XLA as the steps ran
    metrics.update(
        run.report,
        initial_fid_quick=state.get("initial_fid"),
        fid_quick_history=[h.get("fid_quick") for h in history],
        class_accuracy_history=[h.get("class_accuracy_quick") for h in history],
        class_min_history=[h.get("class_min_quick") for h in history],
        consistent_history=[h.get("consistent_quick") for h in history],
        d_loss=history[-1].get("d_loss") if history else None,
        g_loss=history[-1].get("g_loss") if history else None,
        epochs=state["epoch"],
        d_steps=state["step"],
        train_seconds=round(seconds, 1),
        images_per_second=round(state["step"] * train_cfg["batch_size"] / seconds, 1)
        if seconds
        else None,
        stopped_by_time_limit=state["stopped_by_time_limit"],
        keep=train_cfg["keep"],
        kept_epoch=(state.get("best") or {}).get("epoch", state["epoch"]),
        attention_resolution=model_cfg["attention_resolution"],
        runtime=runtime,
        params_g=int(g.count_params()),
        params_d=int(d.count_params()),
        ema=train_cfg["ema"],
    )
    atomic.save_model(sampler, os.path.join(out, "model.keras"))
    atomic.save_model(float32_model(d), os.path.join(out, "discriminator.keras"))
    atomic.write_json(os.path.join(out, "metrics.json"), metrics)
    rng = np.random.default_rng(train_cfg["seed"] + 99)
    calibration = {"noise": rng.standard_normal((200, model_cfg["latent_dim"])).astype(np.float32)}
    if model_cfg["num_classes"]:
        calibration["label"] = (np.arange(200) % model_cfg["num_classes"]).astype(np.int32)
    atomic.save_npz(os.path.join(out, "calibration.npz"), **calibration)
    save_sample_grid(
        sampler.predict_on_batch(fixed), GRID_COLUMNS, os.path.join(out, "samples.png")
    )
    feed = {k: v[:: GRID_COLUMNS + 1][:3] for k, v in fixed.items()}
    result = attention_scores(sampler, feed)
    if result is not None:  # (images, scores, side)
        path = os.path.join(out, "attention.png")
        save_attention_figure(*result, path, data.class_names, feed.get("label"))
    row = {"name": os.path.basename(os.path.normpath(out)), **metrics}
    print(f"\n{out}")
    print(markdown_table([row], SUMMARY_COLUMNS))
    return 0


COMPARE_METRICS = (
    ("fid", "FID"),
    ("class_accuracy", "class acc"),
    ("consistent", "consistent"),
    ("kid", "KID"),
)


def summarize_compare(rows):
    """Per arm (attention / no_attention): mean and sample standard deviation over seeds."""
    summary = []
    for arm in ("attention", "no_attention"):
        runs = [r for r in rows if r["arm"] == arm]
        entry = {"name": arm, "seeds": len(runs)}
        for key, _ in COMPARE_METRICS:
            values = [r[key] for r in runs if r.get(key) is not None]
            if values:
                entry.update(mean_and_std(key, values))
        entry["fid_floor"] = runs[0].get("fid_floor")
        entry["real_consistent"] = runs[0].get("real_consistent")
        summary.append(entry)
    return summary


def _summary_table(summary):
    titles = [title for _, title in COMPARE_METRICS] + ["FID floor", "real consistent"]
    lines = ["| arm | seeds | " + " | ".join(titles) + " |", "|" + "---|" * (len(titles) + 2)]
    for e in summary:
        cells = [
            f"{e[f'{k}_mean']:.4g} ± {e[f'{k}_std']:.2g}" if f"{k}_mean" in e else ""
            for k, _ in COMPARE_METRICS
        ]
        cells += [str(e["fid_floor"]), str(e["real_consistent"])]
        lines.append(f"| {e['name']} | {e['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def train_compare(context, cfg, data):
    """With and without attention, on the same budget and data, for --seeds model seeds
    (--seed, --seed + 1, ...), evaluated by one shared classifier; mean ± std per arm."""
    rundir.create_run_dir(cfg.out, "sagan-compare")
    # The same budget for every run, whatever came before; every run on the compare's data.
    cfg = dataclasses.replace(
        cfg,
        max_minutes=DEFAULT_MAX_MINUTES if cfg.max_minutes is None else cfg.max_minutes,
        data_seed=cfg.resolved_data_seed(),
    )
    classifier = get_classifier(cfg.out, data, config.record(cfg))
    # The attention arm at --attention-resolution, or auto where that says none.
    with_attention = cfg.attention_resolution if cfg.attention() else "auto"
    rows = []
    for k in range(cfg.seeds):
        for arm, attention in (("attention", with_attention), ("no_attention", "none")):
            arm_cfg = dataclasses.replace(cfg, seed=cfg.seed + k, attention_resolution=attention)
            name = arm if cfg.seeds == 1 else f"{arm}_seed{arm_cfg.seed}"
            print(f"\n=== {name} ===", flush=True)
            run_dir = os.path.join(cfg.out, name)
            train_one(context, arm_cfg, data, run_dir, classifier=classifier)
            rows.append(
                {
                    "name": name,
                    "arm": arm,
                    "seed": arm_cfg.seed,
                    **rundir.load_json(os.path.join(run_dir, "metrics.json")),
                }
            )
    summary = summarize_compare(rows)
    table = markdown_table(rows, SUMMARY_COLUMNS)
    means = _summary_table(summary)
    title = (
        f"SAGAN with vs without self-attention on {data.source.get('name')} data "
        f"({cfg.seeds} seed(s), same budget; FID in the run's classifier feature space)"
    )
    text = (
        f"# {title}\n\nMean ± standard deviation over seeds:\n\n{means}\n\nEvery run:\n\n{table}\n"
    )
    atomic.write_text(os.path.join(cfg.out, "compare.md"), text)
    atomic.write_json(
        os.path.join(cfg.out, "compare.json"),
        {"data": data.source, "summary": summary, "runs": rows},
    )
    print(f"\n{text}")
    att, no = summary
    print(
        f"FID with attention: {att.get('fid_mean')}   without: {no.get('fid_mean')}   "
        f"(floor {att['fid_floor']})"
    )
    return 0
