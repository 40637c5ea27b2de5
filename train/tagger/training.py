"""One tagger run (train, resume) and --compare, writing the run-directory contract."""

import dataclasses
import os

import keras
import numpy as np

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from train import buckets, config, engine, rundir
from train.progress import markdown_table
from train.steps import float32_model, make_step
from train.tagger.data import Encoded, build_vocab, word_tag_stats
from train.tagger.fit import compile_tagger
from train.tagger.metrics import accuracies
from train.tagger.select import load_data
from zoo import atomic
from zoo.cli import UsageError
from zoo.tagger.config import ARCHS

MAX_CHARS = 16
MAX_LEN = 256
LEARNING_RATES = {"attention": 1e-3, "fc": 2e-3, "window": 2e-3, "bilstm": 2e-3}
SAMPLE = ["I", "saw", "a", "saw", "."]
VOCAB = ("words", "chars", "tags")  # vocab/NAME.txt of the run directory
SUMMARY_COLUMNS = [
    ("arch", "arch"),
    ("test_accuracy", "test acc"),
    ("test_ambiguous_accuracy", "ambiguous"),
    ("test_unseen_accuracy", "unseen"),
    ("dev_accuracy", "dev acc"),
    ("params", "params"),
    ("train_seconds", "train s"),
    ("tokens_per_second", "tokens/s"),
    ("epochs", "epochs"),
]


def train_one(context, cfg, data, arch, out, vocab=None):
    """One run of `cfg` (train.tagger.TaggerConfig) with `arch`, into `out`, in `context`."""
    keras.utils.set_random_seed(cfg.seed)
    words, chars, tags = vocab or build_vocab(data)
    epochs = cfg.epochs
    if epochs is None:  # --epochs' default: 5 on the embedded data, 40 on files
        epochs = 5 if data.source.get("name") == "embedded" else 40
    model_cfg = {"arch": arch, "max_chars": MAX_CHARS, "max_len": MAX_LEN, **cfg.model_options()}
    try:
        with context.scope():
            model = zoo.build("tagger", words=words, chars=chars, tags=tags, **model_cfg)
    except ValueError as e:
        raise UsageError(f"bad --model-option: {e}") from None
    lr = cfg.learning_rate or LEARNING_RATES[arch]
    train_cfg = config.record(dataclasses.replace(cfg, arch=arch, epochs=epochs, learning_rate=lr))
    rundir.create_run_dir(out, "tagger")
    for name, items in zip(VOCAB, (words, chars, tags)):
        atomic.write_lines(os.path.join(out, "vocab", f"{name}.txt"), items)
    run_config = {
        "kind": "tagger",
        "model": {
            **model_cfg,
            **model.hparams,
            "vocab": {name: f"vocab/{name}.txt" for name in VOCAB},
        },
        "train": train_cfg,
        "data": data.source,
        "runtime": context.runtime(),
    }
    atomic.write_json(os.path.join(out, "config.json"), run_config)
    encoded = _encode(model, data)
    return _fit_and_finish(context, model, data, encoded, out, train_cfg)


def resume_run(context, cfg):
    out = cfg.out
    run_config, recorded = rundir.resumed(cfg, ("tagger",))
    train_cfg = config.record(recorded)
    data = load_data(recorded)
    keras.utils.set_random_seed(train_cfg["seed"] + 1)
    # The untrained model: the step checkpoint then restores the weights and the optimizer.
    vocab = []
    for name in VOCAB:
        with open(os.path.join(out, "vocab", f"{name}.txt"), encoding="utf-8", newline="") as f:
            # split("\n"), not splitlines(): a token may hold U+2028 or U+0085.
            vocab.append(f.read().split("\n")[:-1])
    model_cfg = {k: v for k, v in run_config["model"].items() if k != "vocab"}
    with context.scope():
        model = zoo.build("tagger", words=vocab[0], chars=vocab[1], tags=vocab[2], **model_cfg)
    encoded = _encode(model, data)
    rundir.save_resumed(out, run_config, train_cfg, context)
    return _fit_and_finish(context, model, data, encoded, out, train_cfg, name=out)


def _encode(model, data):
    return {
        name: Encoded(model.encoder, getattr(data, name), model.tags)
        for name in ("train", "dev", "test")
    }


def _fit_and_finish(context, model, data, encoded, out, train_cfg, name=None):
    steps = train_cfg["epochs"] * len(buckets.Batches(encoded["train"], train_cfg["batch_size"]))
    with context.scope():
        rate = compile_tagger(
            model,
            train_cfg["learning_rate"],
            total_steps=max(1, steps),
            warmup_steps=min(400, steps // 10),
            weight_decay=1e-4,
            ema_momentum=train_cfg["ema_momentum"],
        )

    def train_batches(epoch):  # the batch order of an epoch depends on (seed, epoch) only
        return buckets.Batches(
            encoded["train"], train_cfg["batch_size"], [train_cfg["seed"], epoch]
        )

    plan = engine.run_plan(
        context,
        out,
        train_cfg,
        validation=buckets.Batches(encoded["dev"], 64),
        best=engine.highest("val_acc"),
    )
    state = engine.fit(make_step(model, context=context, rate=rate), train_batches, plan, name=name)
    model = float32_model(model)
    metrics = _evaluate(model, data, encoded, state)
    metrics["runtime"] = context.runtime()
    atomic.save_model(model, os.path.join(out, "model.keras"))
    atomic.write_json(os.path.join(out, "metrics.json"), metrics)
    _write_rows(out, "calibration.npz", encoded["train"], train_cfg["seed"], rows=200)
    # Held-out rows for export verify (export reads run directories, never train/).
    _write_rows(out, "evaluation.npz", encoded["test"], train_cfg["seed"], rows=2000)
    from train.tagger.figures import plot_attention

    plot_attention(model, SAMPLE, os.path.join(out, "attention.png"))
    sample = " ".join(f"{w}/{t}" for w, t in model.tag([SAMPLE])[0])
    print(f"\n{out}: {sample}")
    print(markdown_table([metrics], SUMMARY_COLUMNS))
    return 0


def _evaluate(model, data, encoded, state):
    word_tags = word_tag_stats(data)
    metrics = {"arch": model.arch}
    for split in ("test", "dev"):
        for key, value in accuracies(model, encoded[split], word_tags).items():
            name = key.replace("all_", "")
            metrics[f"{split}_{name}"] = value
    train_tokens = int(encoded["train"].lengths.sum())
    seconds = state["train_seconds"]
    metrics.update(
        params=int(model.count_params()),
        train_seconds=round(seconds, 1),
        epochs=state["epoch"],
        best_epoch=(state.get("best") or {}).get("epoch"),
        tokens_per_second=round(train_tokens * state["epoch"] / seconds, 1) if seconds else None,
        stopped_by_time_limit=state["stopped_by_time_limit"],
        train_sentences=len(data.train),
        train_tokens=train_tokens,
    )
    return metrics


def _write_rows(out, name, encoded, seed, rows):
    x, tags, weights = buckets.sample(encoded, rows, seed)
    # Gold tags (-1 on padding) let export report quantized models' accuracy
    # next to float's; export feeds only the arrays named like model inputs.
    gold = np.where(weights > 0, tags, -1).astype("int32")
    atomic.save_npz(os.path.join(out, name), tag_ids=gold, **x)


def train_compare(context, cfg, data):
    """All four archs on the same data and vocabulary; table to stdout, compare.md/.json."""
    rundir.create_run_dir(cfg.out, "tagger-compare")
    vocab = build_vocab(data)
    rows = []
    for arch in ARCHS:
        print(f"\n=== {arch} ===", flush=True)
        train_one(context, cfg, data, arch, os.path.join(cfg.out, arch), vocab=vocab)
        rows.append(rundir.load_json(os.path.join(cfg.out, arch, "metrics.json")))
    table = markdown_table(rows, SUMMARY_COLUMNS)
    title = f"Tagger comparison on {data.source.get('name')} data (test split)"
    atomic.write_text(os.path.join(cfg.out, "compare.md"), f"# {title}\n\n{table}\n")
    atomic.write_json(os.path.join(cfg.out, "compare.json"), {"data": data.source, "runs": rows})
    print(f"\n{title}\n{table}\n(saved to {os.path.join(cfg.out, 'compare.md')})")
    return 0
