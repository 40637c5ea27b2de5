"""One seq2seq run (train, resume, evaluate), writing the run-directory contract.

Default hyper-parameters (train/seq2seq/__init__.py) were chosen for a 2-core CPU and a
30-minute budget on Multi30k-sized data: a pre-LN Transformer, d=256, 3+3 layers,
4 heads, feed-forward 512, dropout 0.1, shared 6k SentencePiece (unigram)
vocabulary with tied embeddings, Adam(0.9, 0.98), warm-up 800 steps to 1e-3 then
inverse-sqrt decay, label smoothing 0.1, batches of 64 length-bucketed pairs,
best-on-dev-accuracy weights (ties: the lower dev loss), or the mean of the last three
epochs' where its dev accuracy is at least as high, beam 4 (alpha 0.6) for the test
set. The generated tasks: 2e-3 after 200 warm-up steps, then a cosine down to zero at
the end of the budget (benchmarks/length_generalisation.md), greedy, the best epoch.
"""

import os
import sys
import time

import keras
import numpy as np

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from train import buckets, config, engine, rundir
from train.model_step import masked_mean_terms
from train.progress import markdown_table
from train.seq2seq.data import Encoded, load_data, train_tokenizer
from train.seq2seq.figures import plot_cross_attention
from train.seq2seq.fit import compile_seq2seq
from train.steps import float32_model, make_step
from zoo import atomic
from zoo.cli import UsageError
from zoo.seq2seq import decoding
from zoo.seq2seq.tokenization import PAD_ID, Tokenizer, encode_proto

SUMMARY = [
    ("arch", "arch"),
    ("test_bleu", "test BLEU"),
    ("test_exact_match", "exact"),
    ("test_long_exact_match", "exact (longer)"),
    ("dev_acc", "dev tok acc"),
    ("params", "params"),
    ("epochs", "epochs"),
    ("train_seconds", "train s"),
    ("decode_tokens_per_second", "decode tok/s"),
]


def _defaults(cfg, text):
    """The defaults that depend on the data: text or an embedded task."""
    if cfg.learning_rate is None:
        cfg.learning_rate = 1e-3 if text else 2e-3
    if cfg.warmup_steps is None:
        cfg.warmup_steps = 800 if text else 200
    if cfg.epochs is None:
        cfg.epochs = 40 if text else 30
    if cfg.beam_width is None:
        cfg.beam_width = 4 if text else 1
    if cfg.schedule == "auto":
        cfg.schedule = "inverse_sqrt" if text else "cosine"
    if cfg.average_last is None:  # the inverse-sqrt rate is still high at the end
        cfg.average_last = 3 if text else 1


def _encode_all(tokenizer, data, sizes, truncate):
    """Every split's `Encoded` within the model's max_source_length and max_target_length
    (of `sizes`, its config): longer-than-trained test sets exceed the training lengths only."""
    limits = (sizes["max_source_length"], sizes["max_target_length"])
    splits = {"train": data.train, "dev": data.dev, "test": data.test, **data.extra}
    return {
        name: Encoded(tokenizer, pairs, *limits, name, truncate=truncate)
        for name, pairs in splits.items()
    }


def train_new(context, cfg, data):
    """A new run of `cfg` (train.seq2seq.Seq2SeqConfig) on `data` into `cfg.out` in
    `context`; returns the trained model and its greedy outputs for the test set."""
    from train.seq2seq.config import model_config

    text = data.task == "text"
    kind = "universal_transformer" if cfg.arch == "universal_transformer" else "seq2seq"
    _defaults(cfg, text)
    keras.utils.set_random_seed(cfg.seed)
    vocab = cfg.vocab_size if text else 64
    started = time.perf_counter()
    proto = train_tokenizer(data, vocab)
    tokenizer = Tokenizer(proto)
    seconds = time.perf_counter() - started
    encoded = _encode_all(tokenizer, data, model_config(cfg, text), cfg.truncate)
    # The longest training source (--cross-length-scale auto), within the model's limit.
    config_model = model_config(cfg, text, max(map(len, encoded["train"].sources)))
    try:
        with context.scope():
            model = zoo.build(kind, tokenizer=encode_proto(proto), **config_model)
    except ValueError as e:
        raise UsageError(f"bad model option: {e}") from None
    # Printed only once the data passed every check: a bad input gets one line.
    print(f"tokenizer: {tokenizer.vocabulary_size} pieces ({seconds:.0f}s)", file=sys.stderr)
    train_cfg = config.record(cfg)
    out = cfg.out
    rundir.create_run_dir(out, kind)
    atomic.write_bytes(os.path.join(out, "vocab", "spm.model"), proto)
    atomic.write_lines(os.path.join(out, "vocab", "pieces.txt"), tokenizer.pieces())
    run_config = {
        "kind": kind,
        "model": model.hparams(),
        "train": train_cfg,
        "data": data.source,
        "task": data.task,
        "tokenizer": "vocab/spm.model",
        "runtime": context.runtime(),
    }
    atomic.write_json(os.path.join(out, "config.json"), run_config)
    return _fit_and_finish(context, model, data, encoded, out, train_cfg)


def resume_run(context, cfg):
    out = cfg.out
    run_config, recorded = rundir.resumed(cfg, ("seq2seq", "universal_transformer"))
    data = load_data(recorded)
    train_cfg = config.record(recorded)
    # The untrained model: the step checkpoint then restores the weights and the
    # optimizer, and checks they fit.
    with open(os.path.join(out, run_config["tokenizer"]), "rb") as f:
        proto = encode_proto(f.read())
    with context.scope():
        model = zoo.build(run_config["kind"], tokenizer=proto, **run_config["model"])
    encoded = _encode_all(model.tokenizer, data, run_config["model"], train_cfg["truncate"])
    rundir.save_resumed(out, run_config, train_cfg, context)
    return _fit_and_finish(context, model, data, encoded, out, train_cfg, name=out)


def _dev_scorer(model, data, encoded, train_cfg):
    """An epoch-end hook logging the task metric of a decoded dev sample (BLEU or exact
    match) as val_bleu / val_exact_match, so a run shows it rising; None without one."""
    n = min(train_cfg["dev_sample"], len(encoded["dev"]))
    if not n:
        return None
    ids = encoded["dev"].sources[:n]
    refs = [t for _, t in data.dev[:n]]
    name = "val_bleu" if data.task == "text" else "val_exact_match"

    def score(epoch, logs):
        hyps = model.tokenizer.decode(decoding.decode_ids(model, ids, beam_width=1))
        logs[name] = _bleu(hyps, refs) if data.task == "text" else 100.0 * _exact(hyps, refs)

    return score


def _fit_and_finish(context, model, data, encoded, out, train_cfg, name=None):
    # The cosine schedule ends at the last planned step, or where the time budget does.
    steps = train_cfg["steps_per_epoch"] or len(
        buckets.Batches(encoded["train"], train_cfg["batch_size"])
    )
    with context.scope():
        rate = compile_seq2seq(
            model,
            train_cfg["learning_rate"],
            train_cfg["warmup_steps"],
            train_cfg["label_smoothing"],
            jit_compile=context.jit_compile,
            schedule=train_cfg["schedule"],
            total_steps=train_cfg["epochs"] * steps,
            ema_momentum=train_cfg["ema_momentum"],
        )
    dev_score = _dev_scorer(model, data, encoded, train_cfg)

    # Training batches padded to their longest rows: a step traced once for every shape
    # (graph, one replica) or relaxed after the first (several) costs ~0.8x a step padded
    # to multiples of 8 (benchmarks/translation.md). Multiples of 8 where XLA compiles
    # each shape, and for random positions: they are drawn over the padded width, and the
    # length recipe was measured with these widths (benchmarks/length_generalisation.md).
    multiple = 8 if context.jit_compile or model.random_positions else 1

    def train_batches(epoch):  # the batch order of an epoch depends on (seed, epoch) only
        return buckets.Batches(
            encoded["train"], train_cfg["batch_size"], train_cfg["seed"] * 1000 + epoch, multiple
        )

    plan = engine.run_plan(
        context,
        out,
        train_cfg,
        steps_per_epoch=train_cfg["steps_per_epoch"],
        validation=buckets.Batches(encoded["dev"], 128),
        # Among equal dev accuracies (a solved task's 1.0) the lowest dev loss: the
        # last epoch's, as the cosine schedule settles.
        best=engine.highest("val_acc", ties="val_loss"),
        hooks=() if dev_score is None else (dev_score,),
        average_last=train_cfg["average_last"],
    )
    step = make_step(model, masked_mean_terms(model.loss, PAD_ID), context, rate)
    state = engine.fit(step, train_batches, plan, name=name)
    model = float32_model(model)
    metrics, greedy = evaluate(model, data, encoded, train_cfg)
    best = state.get("best") or {}
    averaged = state.get("averaged") or {}
    dev_logs = averaged["logs"] if averaged.get("kept") else best.get("logs") or {}
    metrics.update(
        arch=train_cfg["arch"],
        params=int(model.count_params()),
        epochs=state["epoch"],
        best_epoch=best.get("epoch"),
        averaged_epochs=averaged["epochs"] if averaged.get("kept") else None,
        dev_acc=dev_logs.get("val_acc"),
        train_seconds=round(state["train_seconds"], 1),
        stopped_by_time_limit=state["stopped_by_time_limit"],
        train_pairs=len(data.train),
        train_target_tokens_per_second=_train_speed(encoded["train"], train_cfg, state),
        runtime=context.runtime(),
    )
    key = "val_bleu" if data.task == "text" else "val_exact_match"
    if dev_score is not None:
        metrics["dev_history"] = [
            {"epoch": h["epoch"], key[4:]: h[key]} for h in state["history"] if key in h
        ]
    sample = data.test[0][0]
    plot_cross_attention(model, sample, os.path.join(out, "attention.png"))
    metrics["figure"] = "attention.png"
    atomic.save_model(model, os.path.join(out, "model.keras"))
    atomic.write_json(os.path.join(out, "metrics.json"), metrics)
    widths = (model.max_source_length, model.max_target_length)
    x, _ = buckets.sample(encoded["train"], 200, train_cfg["seed"], widths=widths)
    atomic.save_npz(os.path.join(out, "calibration.npz"), **x)
    print(f"\n{out}: {sample!r} -> {greedy[0]!r}")
    print(markdown_table([metrics], SUMMARY))
    return model, greedy


def _train_speed(encoded, train_cfg, state):
    """Target tokens per training second (an epoch may be --steps-per-epoch batches)."""
    if not state["train_seconds"]:
        return None
    passes = state["epoch"]
    if train_cfg["steps_per_epoch"]:
        passes *= min(
            1.0, train_cfg["steps_per_epoch"] * train_cfg["batch_size"] / max(1, len(encoded))
        )
    tokens = sum(len(t) + 1 for t in encoded.targets)  # with each EOS
    return round(tokens * passes / state["train_seconds"], 1)


def _bleu(hyps, refs):
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def _exact(hyps, refs):
    return float(np.mean([h == r for h, r in zip(hyps, refs)])) if refs else 0.0


def _rouge(hyps, refs):
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for h, r in zip(hyps, refs):
        for key, score in scorer.score(r, h).items():
            totals[key] += score.fmeasure
    return {f"test_{k}": round(100.0 * v / max(1, len(refs)), 2) for k, v in totals.items()}


def _timed_decode(model, ids, beam_width, alpha, prefix, sample=256):
    """Decodes every input, then times a second pass over (at most) `sample` of them:
    the first pass compiles one XLA program per batch shape, which a speed figure should
    not include (beam's programs take longer to compile than greedy's). Returns the
    decoded texts and the speeds as PREFIXtokens_per_second and PREFIXsentences_per_second."""
    out = decoding.decode_ids(model, ids, beam_width=beam_width, alpha=alpha)
    timed = ids[:sample]
    started = time.perf_counter()
    again = decoding.decode_ids(model, timed, beam_width=beam_width, alpha=alpha)
    seconds = time.perf_counter() - started
    tokens = sum(len(o) + 1 for o in again)
    return model.tokenizer.decode(out), {
        f"{prefix}tokens_per_second": round(tokens / seconds, 1),
        f"{prefix}sentences_per_second": round(len(timed) / seconds, 1),
    }


def evaluate(model, data, encoded, train_cfg):
    """Test metrics plus decode speed, and the greedy outputs of the test set. Text:
    sacreBLEU and chrF on detokenized output against the raw references, ROUGE
    (rouge-score); tasks: exact match."""
    import sacrebleu

    metrics = {"task": data.task}
    beam, alpha = train_cfg["beam_width"], train_cfg["alpha"]
    test = encoded["test"]
    refs = [t for _, t in data.test]
    greedy, speed = _timed_decode(model, test.sources, 1, alpha, "decode_")
    metrics.update(speed)
    hyps = greedy
    if beam > 1:
        hyps, speed = _timed_decode(model, test.sources, beam, alpha, "beam_decode_")
        metrics.update(beam_width=beam, alpha=alpha, **speed)
    if data.task == "text":
        bleu = sacrebleu.BLEU()
        metrics["test_bleu"] = round(bleu.corpus_score(hyps, [refs]).score, 2)
        metrics["test_bleu_greedy"] = round(_bleu(greedy, refs), 2)
        metrics["test_chrf"] = round(float(sacrebleu.corpus_chrf(hyps, [refs]).score), 2)
        metrics.update(_rouge(hyps, refs))
        metrics["bleu_signature"] = str(bleu.get_signature())
    else:
        metrics["test_exact_match"] = round(_exact(hyps, refs), 4)
        for name in data.extra:
            out = model.tokenizer.decode(
                decoding.decode_ids(model, encoded[name].sources, beam_width=1)
            )
            metrics[f"test_{name}_exact_match"] = round(
                _exact(out, [t for _, t in data.extra[name]]), 4
            )
    metrics["test_examples"] = [
        {"source": s, "reference": r, "output": h} for (s, r), h in list(zip(data.test, hyps))[:5]
    ]
    return metrics, greedy
