"""Training throughput under Keras's JAX backend, the steps `python -m train MODEL
--backend jax` runs: tokens/s of the tagger's and seq2seq's training steps
(`train.jax_step.JaxModelStep`) and images/s of SAGAN's D+G steps
(`train.sagan.jax_fit.JaxSaganStep`).

    KERAS_BACKEND=jax python -m benchmarks.train_throughput_jax [--smoke] [--out PREFIX]
        [--dtype float32|mixed_bfloat16] [--steps N]

Runs with JAX and Keras only: TensorFlow is blocked from importing (a JAX-only GPU
machine has none, and this proves the training steps need none). The models are the
default sizes of the training commands on synthetic batches of the default shapes (the
tagger: 32 sentences of 32 tokens; seq2seq: the Multi30k-sized text model, 64 pairs of
24 -> 24 subwords, a 6k vocabulary; SAGAN: 32x32 RGB, 4 classes, built by
`train.sagan.build_trainer` with the command's defaults: batch 16, EMA, R1); the first
`--warmup` steps (compilation) are not timed. Writes PREFIX.md and PREFIX.json headed by
the device. `--smoke` runs tiny shapes for a few steps (CPU is fine) to prove the script
works; its numbers are no accelerator result and go to a temporary directory.
"""

import argparse
import importlib.abc
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FULL = {
    "tagger": dict(batch=32, length=32, words=20000, chars=200, tags=17),
    "seq2seq": dict(batch=64, source=24, target=24, vocab=6000),
    "sagan": dict(image_size=32, classes=4, argv=[]),
}
SMOKE = {
    "tagger": dict(batch=4, length=8, words=50, chars=20, tags=5, hidden_dim=16, num_layers=1),
    "seq2seq": dict(batch=4, source=8, target=8, vocab=40, hidden_dim=16, layers=1),
    "sagan": dict(
        image_size=32,
        classes=2,
        argv=["--batch-size", "4", "--width", "4", "--latent-dim", "8", "--class-embedding", "8"],
    ),
}


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorflow_text"):
            raise ImportError(f"{name}: TensorFlow is not used by the JAX benchmark")
        return None


def _timed(step, batches, warmup):
    for batch in batches[:warmup]:
        step(batch)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    return time.perf_counter() - start


def bench_tagger(cfg, steps, warmup, rng, context):
    import keras

    from train.jax_step import JaxModelStep
    from train.tagger.fit import compile_tagger
    from zoo.tagger.archs import build_core
    from zoo.tagger.config import ARCH_DEFAULTS, DEFAULTS

    hparams = {**DEFAULTS, **ARCH_DEFAULTS["attention"]}
    hparams.update({k: cfg[k] for k in ("hidden_dim", "num_layers") if k in cfg})
    max_chars = 16
    model = build_core("attention", cfg["words"], cfg["chars"], cfg["tags"], max_chars, hparams)
    total = steps + warmup
    compile_tagger(model, 1e-3, total_steps=total, warmup_steps=1, weight_decay=1e-4)
    shape = (cfg["batch"], cfg["length"])
    batches = [
        (
            {
                "word_ids": rng.integers(2, cfg["words"], shape).astype("int32"),
                "char_ids": rng.integers(2, cfg["chars"], (*shape, max_chars)).astype("int32"),
            },
            rng.integers(0, cfg["tags"], shape).astype("int32"),
            np.ones(shape, "float32"),
        )
        for _ in range(total)
    ]
    step = JaxModelStep(model, context=context)
    step.build(batches[0])
    seconds = _timed(step.train, batches, warmup)
    keras.backend.clear_session()
    return {"unit": "tokens/s", "value": steps * shape[0] * shape[1] / seconds}


def bench_seq2seq(cfg, steps, warmup, rng, context):
    import keras

    from train.jax_step import JaxModelStep
    from train.model_step import masked_mean_terms
    from train.seq2seq.config import TEXT_MODEL
    from train.seq2seq.fit import compile_seq2seq
    from zoo.seq2seq.transformer import Seq2SeqTransformer, build_model

    sizes = dict(TEXT_MODEL)
    if "hidden_dim" in cfg:
        sizes.update(hidden_dim=cfg["hidden_dim"], intermediate_dim=2 * cfg["hidden_dim"])
        sizes.update(num_layers=cfg["layers"], num_heads=2)
    model = build_model(Seq2SeqTransformer, vocabulary_size=cfg["vocab"], **sizes)
    compile_seq2seq(model, 1e-3, 100, 0.1, jit_compile=True)
    total = steps + warmup
    b = cfg["batch"]
    batches = []
    for _ in range(total):
        target = rng.integers(3, cfg["vocab"], (b, cfg["target"])).astype("int32")
        batches.append(
            (
                {
                    "source_ids": rng.integers(3, cfg["vocab"], (b, cfg["source"])).astype("int32"),
                    "target_ids": target,
                },
                target,
            )
        )
    step = JaxModelStep(model, masked_mean_terms(model.loss, 0), context=context)
    step.build(batches[0])
    seconds = _timed(step.train, batches, warmup)
    keras.backend.clear_session()
    return {"unit": "target tokens/s", "value": steps * b * cfg["target"] / seconds}


def bench_sagan(cfg, steps, warmup, rng, context):
    import keras

    from train.engine import At
    from train.sagan import build_trainer
    from train.sagan.losses import R1_EVERY

    # G, D, EMA-G and the step as `python -m train sagan` builds them (its defaults).
    built = build_trainer(cfg["image_size"], 3, cfg["classes"], cfg["argv"], context)
    step, train_cfg = built[3:]
    # Whole cycles of R1_EVERY D steps (one of them carries R1), warm-up and timed: every
    # step function compiles untimed, and the timed steps hold R1 in its share.
    warmup, steps = (-(-n // R1_EVERY) * R1_EVERY for n in (warmup, steps))
    b, s = train_cfg["batch_size"], cfg["image_size"]
    images = rng.uniform(-1, 1, (b, s, s, 3)).astype("float32")
    labels = rng.integers(0, cfg["classes"], b).astype("int32")
    step_index = iter(range(10**9))
    seconds = _timed(
        lambda _: step.train((images, labels), At(next(step_index), 0.0)),
        list(range(steps + warmup)),
        warmup,
    )
    keras.backend.clear_session()
    return {"unit": "images/s", "value": steps * b / seconds, "batch": b, "steps": steps}


BENCHES = {"tagger": bench_tagger, "seq2seq": bench_seq2seq, "sagan": bench_sagan}


def _device():
    import jax

    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few steps")
    parser.add_argument("--out", default=None, help="PREFIX of PREFIX.md / PREFIX.json")
    parser.add_argument("--dtype", default="float32", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 50)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3)")
    parser.add_argument("--only", choices=sorted(BENCHES), default=None)
    args = parser.parse_args(argv)
    if os.environ.get("KERAS_BACKEND") != "jax":
        print("error: run with KERAS_BACKEND=jax", file=sys.stderr)
        return 2
    sys.meta_path.insert(0, _NoTensorFlow())
    sys.path.insert(0, ROOT)
    import keras

    from train import strategy

    # The policy and the steps' run context through train.strategy, as the training
    # commands have them (an "auto" there would turn bfloat16 on by itself on a GPU).
    context = strategy.configure(argparse.Namespace(mixed_precision=args.dtype))
    steps = args.steps or (3 if args.smoke else 50)
    warmup = args.warmup or (1 if args.smoke else 3)
    sizes = SMOKE if args.smoke else FULL
    rows = []
    for name in [args.only] if args.only else list(BENCHES):
        rng = np.random.default_rng(0)
        result = BENCHES[name](sizes[name], steps, warmup, rng, context)
        rows.append({"model": name, "batch": sizes[name].get("batch"), "steps": steps, **result})
        print(f"{name}: {result['value']:.1f} {result['unit']}", flush=True)
    assert "tensorflow" not in sys.modules, "TensorFlow was imported"
    device = _device()
    head = (
        f"Device: {device}; Keras {keras.__version__}, JAX "
        f"{__import__('jax').__version__}, Python {platform.python_version()}; "
        f"{args.dtype}; {steps} timed steps after {warmup} untimed (SAGAN: whole R1 cycles)"
        + ("; SMOKE (tiny shapes, not a result)" if args.smoke else "")
    )
    prefix = args.out or (
        os.path.join(tempfile.mkdtemp(prefix="train_jax_"), "smoke")
        if args.smoke
        else os.path.join(HERE, "train_throughput_jax")
    )
    table = ["| model | throughput | unit | batch | timed steps |", "|---|---|---|---|---|"]
    table += [
        f"| {r['model']} | {r['value']:.1f} | {r['unit']} | {r['batch']} | {r['steps']} |"
        for r in rows
    ]
    with open(prefix + ".md", "w", encoding="utf-8") as f:
        f.write(f"# Training throughput under JAX\n\n{head}\n\n" + "\n".join(table) + "\n")
    with open(prefix + ".json", "w", encoding="utf-8") as f:
        json.dump({"device": device, "head": head, "rows": rows}, f, indent=2)
    print(f"{head}\nwrote {prefix}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
