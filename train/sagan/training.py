"""One SAGAN run (train, resume) and --compare, writing the run-directory contract.

RUN_DIR/model.keras          the generator (EMA weights when --ema > 0)
RUN_DIR/discriminator.keras  the discriminator
RUN_DIR/classifier.keras     the frozen evaluation classifier (FID/KID feature space)
RUN_DIR/config.json          kind "sagan", generator kwargs under "model", "train", "data"
RUN_DIR/metrics.json         fid, kid, fid_floor, kid_floor, class_accuracy, ...
RUN_DIR/calibration.npz      noise (and label) rows for int8 calibration of the export
RUN_DIR/vocab/classes.txt    class names, one per line (label id = line number)
RUN_DIR/samples/epoch_NNN.png, samples.png, attention.png, logs/ (TensorBoard),
RUN_DIR/checkpoints/         state.npz + state.json (resume), at epoch ends and, with
                             --checkpoint-every N, every N D steps (recording the
                             batches done in the epoch and their losses, so --resume
                             continues with the next batch of that epoch)
"""

import os
import sys
import time

import numpy as np

from train import rundir
from train import strategy as dist
from train.progress import markdown_table
from zoo import atomic
from zoo.cli import UsageError

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


def _model_config(args, data, attention):
    from zoo.sagan.model import resolve_attention

    conditional = data.num_classes > 1 and not args.unconditional
    attention = resolve_attention(data.image_size, attention)
    return {
        "image_size": data.image_size,
        "channels": data.channels,
        "num_classes": data.num_classes if conditional else None,
        "latent_dim": args.latent_dim,
        "width": args.width,
        "attention_resolution": attention,
        "seed": args.seed,
        "class_embedding": args.class_embedding if conditional else 0,
    }


def _d_config(model_cfg):
    return {k: v for k, v in model_cfg.items() if k not in ("latent_dim", "class_embedding")}


def _data_seed(train_cfg):
    # The seed the data were made or split with; the real images FID is measured against
    # follow it too (not the model seed), so the runs of --compare share one floor.
    # Runs written before data_seed existed used --seed for both.
    return train_cfg.get("data_seed", train_cfg["seed"])


def _train_config(args):
    from train.sagan.images import data_flags

    # data_seed: the seed the data were made or split with (--data-seed, else --seed;
    # --compare trains several model seeds on one data set); "seed" is the models'.
    flags = data_flags(args)
    return {
        **flags,
        "seed": args.seed,
        "data_seed": flags["seed"],
        "epochs": DEFAULT_EPOCHS if args.epochs is None else args.epochs,
        "batch_size": args.batch_size,
        "n_dis": args.n_dis,
        "lr_g": args.lr_g,
        "lr_d": args.lr_d,
        "beta1": args.beta1,
        "beta2": args.beta2,
        "ema": args.ema,
        "mode_seeking": args.mode_seeking,
        "class_loss": args.class_loss,
        "r1": args.r1,
        "lr_decay_from": args.lr_decay_from,
        "keep": args.keep,
        "verbose": str(args.verbose),
        "eval_samples": args.eval_samples,
        "epoch_eval_samples": args.epoch_eval_samples,
        "classifier_epochs": args.classifier_epochs,
        "max_minutes": args.max_minutes,
        "unconditional": bool(args.unconditional),
    }


def _build(model_cfg, train_cfg):
    """G, D and EMA-G, built in the distribution strategy's scope (train/strategy.py)."""
    # The builders themselves, not zoo.build: that imports every zoo model, TensorFlow
    # with the tagger's, and the JAX benchmark builds these where TensorFlow is absent.
    from train import strategy as dist
    from zoo.sagan.model import build_discriminator, build_generator

    g_cfg = dict(model_cfg)
    d_cfg = _d_config(model_cfg)
    with dist.scope():
        try:
            g = build_generator(**g_cfg)
            d = build_discriminator(**d_cfg)
        except ValueError as e:
            raise UsageError(str(e)) from None
        ema = None
        if train_cfg["ema"] > 0:
            ema = build_generator(**g_cfg)
            ema.set_weights(g.get_weights())
    return g, d, ema


class _Sampler:
    """The model that makes images for FID, figures and model.keras.

    Under a distribution strategy, Keras's `predict_on_batch` on a mirrored model hands
    the whole batch to every replica and concatenates their outputs, so sampling (and
    the saved model) use a plain one-device copy of the generator, refreshed from the
    trained weights when asked. On one device it is the generator itself.
    """

    def __init__(self, source, model_cfg):
        import tensorflow as tf

        from train import strategy as dist

        self.source = source
        with dist.scope():
            distributed = tf.distribute.has_strategy()
        self.model = source
        if distributed:
            import zoo

            self.model = zoo.build("sagan_generator", **model_cfg)
            self.refresh()

    def refresh(self):
        if self.model is not self.source:
            self.model.set_weights(self.source.get_weights())
        return self.model


def check_replicas(batch_size):
    """--batch-size is the global batch: every replica needs at least one row of it."""
    from train import strategy as dist

    replicas = int(dist.get().num_replicas_in_sync)
    if batch_size < replicas:
        raise UsageError(
            f"--batch-size must be >= the number of replicas ({replicas}), got {batch_size}"
        )


def get_classifier(out, data, train_cfg, classifier=None):
    """The run's frozen classifier: given (compare), already in the run, or trained now."""
    from train.sagan.fid_classifier import load_cached, save_cached

    cached = load_cached(out) if classifier is None else None  # checked; damaged: None, said
    if cached is not None:
        return cached
    report = {}
    if classifier is None:
        from train.sagan.fid_classifier import train_classifier

        print(
            f"training the evaluation classifier ({train_cfg['classifier_epochs']} epochs)...",
            file=sys.stderr,
            flush=True,
        )
        classifier, report = train_classifier(
            data, epochs=train_cfg["classifier_epochs"], seed=_data_seed(train_cfg)
        )
    else:
        from train.sagan.fid_classifier import evaluate_real

        report = evaluate_real(classifier, data)
    save_cached(classifier, report, out)
    return classifier, report


_FLAG = object()


def default_budget(elapsed_minutes):
    """Training minutes of a default run that has taken `elapsed_minutes` so far:
    DEFAULT_MAX_MINUTES, or what is left of RUN_MINUTES (at least MIN_MINUTES)."""
    return max(MIN_MINUTES, min(DEFAULT_MAX_MINUTES, RUN_MINUTES - elapsed_minutes))


def _resolve_budget(args, train_cfg):
    """Sets train_cfg["max_minutes"] where --max-minutes was not given (None); True when
    it did. Several workers get DEFAULT_MAX_MINUTES: each one's clock would give its own."""
    if train_cfg["max_minutes"] is not None:
        return False
    started = getattr(args, "started", None)
    if started is None or dist.worker()[1] > 1:
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


def train_one(args, data, out, attention=_FLAG, classifier=None):
    """One run; `attention` overrides --attention-resolution (None = no attention)."""
    import keras

    attention = args.attention if attention is _FLAG else attention
    keras.utils.set_random_seed(args.seed)
    model_cfg = _model_config(args, data, attention)
    train_cfg = _train_config(args)
    g, d, ema = _build(model_cfg, train_cfg)
    rundir.create_run_dir(out, "sagan")
    atomic.write_lines(os.path.join(out, "vocab", "classes.txt"), data.class_names)
    d_cfg = _d_config(model_cfg)
    config = {
        "kind": "sagan",
        "model": model_cfg,
        "discriminator": d_cfg,
        "train": train_cfg,
        "data": data.source,
        "class_names": list(data.class_names),
        "runtime": dist.runtime(),
    }
    atomic.write_json(os.path.join(out, "config.json"), config)
    classifier, report = get_classifier(out, data, train_cfg, classifier)
    if _resolve_budget(args, train_cfg):
        atomic.write_json(os.path.join(out, "config.json"), config)  # resume reads it
    state = {"epoch": 0, "d_steps": 0, "train_seconds": 0.0, "history": []}
    return _fit_and_finish(out, config, data, g, d, ema, classifier, report, state)


def resume_run(args):
    out = args.out
    config_path = os.path.join(out, "config.json")
    ckpt = os.path.join(out, "checkpoints")
    from train.sagan.fit import has_checkpoint

    if not os.path.exists(config_path) or not has_checkpoint(ckpt):
        raise UsageError(
            f"--resume: no checkpoint to resume in {out} (missing config.json or checkpoints/)"
        )
    config = rundir.read_json(config_path)
    if config.get("kind") != "sagan":
        raise UsageError(f"--resume: {out} is not a sagan run (kind={config.get('kind')!r})")
    train_cfg = config["train"]
    if args.epochs is not None:
        train_cfg["epochs"] = args.epochs
    if train_cfg.get("max_minutes") is None:  # stopped before its budget was set
        train_cfg["max_minutes"] = DEFAULT_MAX_MINUTES
    train_cfg["verbose"] = str(args.verbose)
    check_replicas(train_cfg["batch_size"])
    from train.sagan.images import load_images

    flags = {
        k: train_cfg[k]
        for k in ("dataset", "image_dir", "image_size", "train_size", "test_size", "max_images")
    }
    data = load_images(**flags, seed=_data_seed(train_cfg))
    import keras

    keras.utils.set_random_seed(train_cfg["seed"])
    g, d, ema = _build(config["model"], train_cfg)
    classifier, report = get_classifier(out, data, train_cfg)
    config["train"] = train_cfg
    config["runtime"] = dist.runtime()  # where the resumed part trains
    atomic.write_json(config_path, config)
    trainer = _trainer(g, d, ema, config["model"], train_cfg)
    state = trainer.restore(ckpt)
    keras.utils.set_random_seed(train_cfg["seed"] + state["epoch"])
    within = f", batch {state['batches_done']}" if state.get("batches_done") else ""
    print(
        f"resuming {out} at epoch {state['epoch']}{within} of {train_cfg['epochs']}",
        file=sys.stderr,
    )
    return _fit_and_finish(out, config, data, g, d, ema, classifier, report, state, trainer)


def _trainer(g, d, ema, model_cfg, train_cfg):
    import keras

    from train import strategy as dist

    if keras.backend.backend() == "jax":
        from train.sagan.jax_fit import JaxSaganTrainer as SaganTrainer
    else:
        from train.sagan.fit import SaganTrainer

    trainer = SaganTrainer(
        g,
        d,
        num_classes=model_cfg["num_classes"],
        latent_dim=model_cfg["latent_dim"],
        lr_g=train_cfg["lr_g"],
        lr_d=train_cfg["lr_d"],
        beta_1=train_cfg["beta1"],
        beta_2=train_cfg["beta2"],
        n_dis=train_cfg["n_dis"],
        ema=ema,
        ema_decay=train_cfg["ema"],
        seed=train_cfg["seed"],
        strategy=dist.get(),
        jit_compile=dist.jit_compile(),
        mode_seeking=train_cfg.get("mode_seeking", 0.0),
        class_loss=train_cfg.get("class_loss", 0.0),
        r1=train_cfg.get("r1", 0.0),
    )
    if dist.jit_compile() and not trainer.jit_compile:
        print(
            f"XLA: off for sagan on {trainer.replicas} replicas (an XLA computation runs on one "
            f"device; docs/distributed.md)",
            file=sys.stderr,
        )
    return trainer


CLASS_FLOOR = 0.9


def _draws_every_class(class_min):
    """Whether the worst class was recognised in >= CLASS_FLOOR of its images (None:
    unconditional, or a best checkpointed before class_min existed: counts as yes)."""
    return class_min is None or class_min >= CLASS_FLOOR


def _rank(fid, class_min):
    """Sort key of a sampler (lower is better): the samplers that draw every class
    first, then the lowest FID."""
    return (0 if _draws_every_class(class_min) else 1, fid)


def _improves(entry, state):
    """Whether this epoch's sampler is the best so far: among the epochs that draw every
    class (the worst class recognised in >= 90% of 1,000 images of fresh noise), the
    lowest quick FID; until one does, the lowest quick FID. The final evaluation draws
    other noise. GAN runs swing late, and FID alone kept epochs that had lost one class
    (benchmarks/sagan.md); this keeps a good epoch instead of the last."""
    fid = entry.get("fid_quick")
    if fid is None:
        return False
    if state.get("best_fid_quick") is None:
        return True
    # A best checkpointed before class_min existed has None: it counts as drawing every class.
    return _rank(fid, entry.get("class_min_quick")) < _rank(
        state["best_fid_quick"], state.get("best_class_min")
    )


def lr_scale(progress, decay_from):
    """The learning rates' factor at `progress` (the budget's fraction done: steps of
    --epochs or minutes of --max-minutes, whichever is further): 1 until `decay_from`,
    then linear to 0 at the end. Runs that swung late in the budget settle (#16)."""
    if decay_from >= 1.0 or progress <= decay_from:
        return 1.0
    return max(0.0, (1.0 - progress) / (1.0 - decay_from))


def _fixed_latents(model_cfg, seed, rows=None):
    num_classes = model_cfg["num_classes"]
    rows = rows or (min(num_classes, 10) if num_classes else GRID_COLUMNS)
    rng = np.random.default_rng(seed + 12345)
    noise = rng.standard_normal((GRID_COLUMNS, model_cfg["latent_dim"])).astype(np.float32)
    noise = (
        np.tile(noise, (rows, 1))
        if num_classes
        else rng.standard_normal((rows * GRID_COLUMNS, model_cfg["latent_dim"])).astype(np.float32)
    )
    feed = {"noise": noise}
    if num_classes:
        feed["label"] = np.repeat(np.arange(rows), GRID_COLUMNS).astype(np.int32)
    return feed


def _fit_and_finish(
    out, config, data, g, d, ema, classifier, classifier_report, state, trainer=None
):
    from train import preemption  # SIGTERM / SIGINT: save the step, then stop (#23)
    from train import strategy as dist

    model_cfg, train_cfg = config["model"], config["train"]
    trainer = trainer or _trainer(g, d, ema, model_cfg, train_cfg)
    # What the steps really run with: SAGAN's are not XLA-compiled on several replicas
    # even when --jit-compile (or a GPU's default) asks for it.
    runtime = {**dist.runtime(), "jit_compile": trainer.jit_compile}
    if config.get("runtime") != runtime:
        config["runtime"] = runtime
        atomic.write_json(os.path.join(out, "config.json"), config)
    dist.announce(runtime)
    loop = _Loop(out, config, data, trainer, state, ema if ema is not None else g, classifier)
    sampler = loop.sampler
    try:
        stopped = loop.run()
        if loop.stops.finish():  # a signal after the last step
            preemption.stop(f"{loop.where} at the end of epoch {state['epoch']}")
    finally:
        loop.stops.close()
    preemption.done_listening(f"{loop.where} at the end of epoch {state['epoch']}")
    loop.sampling.refresh()
    if train_cfg.get("keep", "last") == "best" and trainer.apply_best(sampler):
        worst = state.get("best_class_min")
        which = (
            f"every class >= {CLASS_FLOOR:.0%}, the lowest FID of such epochs"
            if worst is not None and _draws_every_class(worst)
            else "the lowest of the run"
        )
        print(
            f"keeping the generator of epoch {state['best_epoch']} (quick FID "
            f"{state['best_fid_quick']}, {which})",
            file=sys.stderr,
            flush=True,
        )
    distribution = {**dist.describe(), "jit_compile": trainer.jit_compile}
    return _finish(
        out,
        config,
        data,
        g,
        d,
        sampler,
        classifier,
        classifier_report,
        state,
        stopped,
        distribution,
    )


class _Loop:
    """One run's training epochs (until --epochs or --max-minutes): the steps, the
    per-epoch evaluation, sample grid, TensorBoard logs and checkpoint, and the stop
    checks after each step (a signal, the time limit; several workers agree on both).
    `run()` returns True when the time limit ended the run."""

    def __init__(self, out, config, data, trainer, state, source, classifier):
        import tensorflow as tf

        from train import preemption
        from train import strategy as dist
        from train.sagan.evaluation import Evaluator

        self.out, self.data, self.trainer, self.state = out, data, trainer, state
        self.model_cfg, self.train_cfg = config["model"], config["train"]
        verbose = str(self.train_cfg.get("verbose", "auto"))
        self.show_bar = verbose == "1" or (verbose == "auto" and sys.stderr.isatty())
        self.sampling = _Sampler(source, self.model_cfg)
        self.sampler = self.sampling.model
        self.chief = dist.is_chief()
        self.ckpt = os.path.join(out, "checkpoints")
        self.samples_dir = os.path.join(out, "samples")
        os.makedirs(self.samples_dir, exist_ok=True)
        self.writer = tf.summary.create_file_writer(os.path.join(out, "logs"))
        self.quick = None
        if self.train_cfg["epoch_eval_samples"]:
            self.quick = Evaluator(
                classifier,
                data,
                self.train_cfg["epoch_eval_samples"],
                seed=_data_seed(self.train_cfg),
            )
        if "initial_fid" not in state:  # a step checkpoint of epoch 1 already holds it
            state["initial_fid"] = self.quick_eval()["fid_quick"]
        self.fixed = _fixed_latents(self.model_cfg, self.train_cfg["seed"])
        # A step checkpoint: the batches of state["epoch"] already trained, and their logs.
        self.skip = state.pop("batches_done", 0)
        self.sums = state.pop("partial_logs", {})
        preemption.listen()
        # Several workers agree on the step to stop after (one was signalled, all stop).
        self.stops = preemption.StepStops(*dist.worker())
        self.where = (
            f"wrote {os.path.join(self.ckpt, 'state.npz')}"
            if self.chief
            else "the chief wrote the checkpoint"
        )

    def quick_eval(self):
        if self.quick is None:
            return {"fid_quick": None}
        self.sampling.refresh()
        return self.quick.progress(
            self.sampler,
            self.model_cfg["latent_dim"],
            self.model_cfg["num_classes"],
            seed=self.train_cfg["seed"] + 7,
        )

    def _save_step(self, done, sums, started):
        self.trainer.save(
            self.ckpt,
            {
                **self.state,
                "batches_done": done,
                "partial_logs": sums,
                "train_seconds": self.state["train_seconds"] + time.perf_counter() - started,
            },
        )

    def run(self):
        import keras

        from train import preemption
        from train import strategy as dist

        trainer, state, data = self.trainer, self.state, self.data
        train_cfg, model_cfg = self.train_cfg, self.model_cfg
        batch = train_cfg["batch_size"]
        steps = max(1, len(data.train) // batch)
        limit = train_cfg["max_minutes"] * 60.0
        total_steps = max(1, steps * train_cfg["epochs"])
        every = dist.checkpoint_every()
        skip, sums = self.skip, self.sums
        stopped = False
        for epoch in range(state["epoch"], train_cfg["epochs"]):
            if self.stops.time_up(
                bool(limit) and state["train_seconds"] >= limit, state["d_steps"], self.chief
            ):
                stopped = True
                break
            started = time.perf_counter()
            order = np.random.default_rng(train_cfg["seed"] + epoch).permutation(len(data.train))
            print(f"epoch {epoch + 1}/{train_cfg['epochs']}", file=sys.stderr, flush=True)
            bar = keras.utils.Progbar(
                steps,
                stateful_metrics=["d_loss", "g_loss", "d_real", "d_fake", "mode_seeking"],
                verbose=1 if self.show_bar else 0,
            )
            done = skip
            for i in range(skip, steps):
                idx = order[i * batch : (i + 1) * batch]
                elapsed = state["train_seconds"] + time.perf_counter() - started
                trainer.set_lr_scale(
                    lr_scale(
                        max(state["d_steps"] / total_steps, elapsed / limit if limit else 0.0),
                        train_cfg.get("lr_decay_from", 1.0),
                    )
                )
                real = data.train[idx].astype(np.float32) / 127.5 - 1.0
                labels = (
                    data.train_labels[idx]
                    if model_cfg["num_classes"]
                    else np.zeros(len(idx), np.int32)
                )
                logs = trainer.train_batch(real, labels.astype(np.int32), state["d_steps"])
                state["d_steps"] += 1
                for k, v in logs.items():
                    if not np.isfinite(v):
                        raise FloatingPointError(
                            f"{k} became {v} at epoch {epoch + 1}, step {i + 1}"
                        )
                    sums.setdefault(k, []).append(v)
                bar.update(i + 1, [(k, v) for k, v in logs.items()])
                done = i + 1
                if every and state["d_steps"] % every == 0 and done < steps and self.chief:
                    self._save_step(done, sums, started)
                if self.stops.signalled(state["d_steps"]):
                    if self.chief:
                        self._save_step(done, sums, started)
                    preemption.stop(f"{self.where} at epoch {epoch + 1}, batch {done}")
                over = state["train_seconds"] + time.perf_counter() - started >= limit
                if self.stops.time_up(bool(limit) and over, state["d_steps"], self.chief):
                    stopped = True
                    break
            state["train_seconds"] += time.perf_counter() - started
            self._end_epoch(epoch, done, sums)
            skip, sums = 0, {}
            if stopped:
                break
        return stopped

    def _end_epoch(self, epoch, done, sums):
        import tensorflow as tf

        from train.sagan.figures import save_progress_figure, save_sample_grid

        state = self.state
        means = {k: round(float(np.mean(v)), 5) for k, v in sums.items()}
        entry = {"epoch": epoch + 1, "steps": done, **means, **self.quick_eval()}
        state["history"].append(entry)
        state["epoch"] = epoch + 1
        if self.train_cfg.get("keep", "last") == "best" and _improves(entry, state):
            self.trainer.remember_best(self.sampler)  # quick_eval refreshed it
            state["best_epoch"], state["best_fid_quick"] = epoch + 1, entry["fid_quick"]
            state["best_class_min"] = entry.get("class_min_quick")
        images = np.asarray(self.sampling.refresh().predict_on_batch(self.fixed))
        save_sample_grid(
            images, GRID_COLUMNS, os.path.join(self.samples_dir, f"epoch_{epoch + 1:03d}.png")
        )
        with self.writer.as_default(step=epoch + 1):
            for k, v in entry.items():
                if k not in ("epoch", "steps") and v is not None:
                    tf.summary.scalar(k, v)
            tf.summary.image("samples", (images[:16] + 1.0) / 2.0, max_outputs=16)
        self.writer.flush()
        if self.chief:
            self.trainer.save(self.ckpt, state)
        print(
            f"  d_loss {means.get('d_loss')}  g_loss {means.get('g_loss')}  "
            f"FID {entry['fid_quick']}  class acc {entry.get('class_accuracy_quick')}  "
            f"consistent {entry.get('consistent_quick')}",
            file=sys.stderr,
            flush=True,
        )
        if self.chief:
            save_progress_figure(state["history"], os.path.join(self.out, "progress.png"))


def _finish(
    out, config, data, g, d, sampler, classifier, classifier_report, state, stopped, distribution
):
    from train.sagan.evaluation import Evaluator
    from train.sagan.figures import save_attention_figure, save_sample_grid
    from zoo.sagan.model import attention_scores

    model_cfg, train_cfg = config["model"], config["train"]
    evaluator = Evaluator(classifier, data, train_cfg["eval_samples"], seed=_data_seed(train_cfg))
    metrics = evaluator.evaluate(
        sampler,
        model_cfg["latent_dim"],
        model_cfg["num_classes"],
        seed=train_cfg["seed"] + 1,
        class_names=data.class_names,
    )
    seconds = state["train_seconds"]
    metrics.update(
        classifier_report,
        initial_fid_quick=state.get("initial_fid"),
        fid_quick_history=[h.get("fid_quick") for h in state["history"]],
        class_accuracy_history=[h.get("class_accuracy_quick") for h in state["history"]],
        class_min_history=[h.get("class_min_quick") for h in state["history"]],
        consistent_history=[h.get("consistent_quick") for h in state["history"]],
        d_loss=state["history"][-1].get("d_loss") if state["history"] else None,
        g_loss=state["history"][-1].get("g_loss") if state["history"] else None,
        epochs=state["epoch"],
        d_steps=state["d_steps"],
        train_seconds=round(seconds, 1),
        images_per_second=round(state["d_steps"] * train_cfg["batch_size"] / seconds, 1)
        if seconds
        else None,
        stopped_by_time_limit=bool(stopped),
        keep=train_cfg.get("keep", "last"),
        kept_epoch=state.get("best_epoch", state["epoch"])
        if train_cfg.get("keep") == "best"
        else state["epoch"],
        attention_resolution=model_cfg["attention_resolution"],
        distribution=distribution,
        runtime=config["runtime"],  # set by _fit_and_finish: XLA as the steps ran
        params_g=int(g.count_params()),
        params_d=int(d.count_params()),
        ema=train_cfg["ema"],
    )
    atomic.save_model(sampler, os.path.join(out, "model.keras"))
    atomic.save_model(d, os.path.join(out, "discriminator.keras"))
    atomic.write_json(os.path.join(out, "metrics.json"), metrics)
    rng = np.random.default_rng(train_cfg["seed"] + 99)
    calibration = {"noise": rng.standard_normal((200, model_cfg["latent_dim"])).astype(np.float32)}
    if model_cfg["num_classes"]:
        calibration["label"] = (np.arange(200) % model_cfg["num_classes"]).astype(np.int32)
    atomic.save_npz(os.path.join(out, "calibration.npz"), **calibration)
    fixed = _fixed_latents(model_cfg, train_cfg["seed"])
    save_sample_grid(
        np.asarray(sampler.predict_on_batch(fixed)), GRID_COLUMNS, os.path.join(out, "samples.png")
    )
    feed = {k: v[:: GRID_COLUMNS + 1][:3] for k, v in fixed.items()}
    result = attention_scores(sampler, feed)
    if result is not None:
        images, scores, side = result
        save_attention_figure(
            np.asarray(images),
            np.asarray(scores),
            side,
            os.path.join(out, "attention.png"),
            data.class_names,
            feed.get("label"),
        )
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
                entry[f"{key}_mean"] = round(float(np.mean(values)), 4)
                entry[f"{key}_std"] = (
                    round(float(np.std(values, ddof=1)), 4) if len(values) > 1 else 0.0
                )
        entry["fid_floor"] = runs[0].get("fid_floor") if runs else None
        entry["real_consistent"] = runs[0].get("real_consistent") if runs else None
        summary.append(entry)
    return summary


def _summary_table(summary):
    def cell(entry, key):
        if f"{key}_mean" not in entry:
            return ""
        return f"{entry[f'{key}_mean']:.4g} ± {entry[f'{key}_std']:.2g}"

    head = (
        "| arm | seeds | "
        + " | ".join(title for _, title in COMPARE_METRICS)
        + " | FID floor | real consistent |"
    )
    lines = [head, "|" + "---|" * (len(COMPARE_METRICS) + 4)]
    for e in summary:
        cells = [cell(e, key) for key, _ in COMPARE_METRICS]
        lines.append(
            f"| {e['name']} | {e['seeds']} | "
            + " | ".join(cells)
            + f" | {e['fid_floor']} | {e['real_consistent']} |"
        )
    return "\n".join(lines)


def train_compare(args, data):
    """With and without attention, on the same budget and data, for --seeds model seeds
    (--seed, --seed + 1, ...), evaluated by one shared classifier; mean ± std per arm."""
    import copy

    rundir.create_run_dir(args.out, "sagan-compare")
    if args.max_minutes is None:  # the same budget for every run, whatever came before
        args.max_minutes = DEFAULT_MAX_MINUTES
    train_cfg = _train_config(args)
    classifier, _ = get_classifier(args.out, data, train_cfg)
    rows = []
    for k in range(args.seeds):
        seed_args = copy.copy(args)
        seed_args.seed = args.seed + k
        seed_args.data_seed = _data_seed(train_cfg)  # every run on the compare's data
        for arm, attention in (("attention", args.attention or "auto"), ("no_attention", None)):
            name = arm if args.seeds == 1 else f"{arm}_seed{seed_args.seed}"
            print(f"\n=== {name} ===", flush=True)
            run_dir = os.path.join(args.out, name)
            train_one(
                seed_args,
                data,
                run_dir,
                attention=attention,
                classifier=classifier,
            )
            rows.append(
                {
                    "name": name,
                    "arm": arm,
                    "seed": seed_args.seed,
                    **rundir.read_json(os.path.join(run_dir, "metrics.json")),
                }
            )
    summary = summarize_compare(rows)
    table = markdown_table(rows, SUMMARY_COLUMNS)
    means = _summary_table(summary)
    title = (
        f"SAGAN with vs without self-attention on {data.source.get('name')} data "
        f"({args.seeds} seed(s), same budget; FID in the run's classifier feature space)"
    )
    text = (
        f"# {title}\n\nMean ± standard deviation over seeds:\n\n{means}\n\nEvery run:\n\n{table}\n"
    )
    atomic.write_text(os.path.join(args.out, "compare.md"), text)
    atomic.write_json(
        os.path.join(args.out, "compare.json"),
        {"data": data.source, "summary": summary, "runs": rows},
    )
    print(f"\n{text}")
    att, no = summary
    print(
        f"FID with attention: {att.get('fid_mean')}   without: {no.get('fid_mean')}   "
        f"(floor {att['fid_floor']})"
    )
    return 0
