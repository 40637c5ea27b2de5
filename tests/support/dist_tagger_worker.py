"""A tiny tagger training run for tests/train/test_distributed.py (one process of a run).

python tests/support/dist_tagger_worker.py --strategy default|mirrored|multi_worker --out DIR
    [--epochs N] [--resume]
Trains the tagger of train.tagger.training (same model, optimizer, batches, engine) on a small
embedded data set for --epochs epochs of 3 steps each; at each epoch end every process
writes its weights to DIR/weights-e{epoch}-w{worker}.npz and their moving average
(the optimizer's EMA, `--ema`, on in every run: it leaves the raw updates
alone) to DIR/averaged-e{epoch}-w{worker}.npz. The chief writes step checkpoints to
DIR/checkpoints. `mirrored` uses two logical CPU devices. SIGTERM / SIGINT stop it as
they stop `python -m train` (train.preemption): one line, exit 143 / 130.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tests.support import tiny  # noqa: E402  (after the path and environment)

TINY = {**tiny.TAGGER_MINI_MODEL, "dropout": 0.0, "word_dropout": 0.0}
STEPS = 3
GLOBAL_BATCH = 8
EMA_MOMENTUM = 0.5  # low, so a few steps move the average far from the initial weights


def main():
    from train import preemption

    # SIGTERM / SIGINT as under python -m train: the handlers go in before the strategy
    # starts TensorFlow's runtime (which installs its own SIGTERM handler).
    try:
        with preemption.handlers() as signals:
            run(signals)
    except preemption.Stopped as e:
        print(e, flush=True)
        sys.exit(e.code)


def run(signals):
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="default")
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--mixed-precision", action="store_true")
    args = p.parse_args()
    if args.strategy == "mirrored":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
    from train import strategy as distribute

    context = distribute.configure(
        argparse.Namespace(
            strategy=args.strategy,
            checkpoint_every=2,
            jit_compile=False,
            mixed_precision=args.mixed_precision,
        ),
        signals,
    )
    import keras
    import numpy as np

    import zoo
    from train import engine
    from train.buckets import Batches
    from train.steps import make_step
    from train.tagger import embedded
    from train.tagger.data import build_vocab
    from train.tagger.fit import compile_tagger
    from train.tagger.training import MAX_CHARS, _encode

    keras.utils.set_random_seed(0)
    data = embedded.generate(seed=0, train_size=GLOBAL_BATCH * STEPS, dev_size=8, test_size=8)
    words, chars, tags = build_vocab(data)
    with context.scope():
        model = zoo.build(
            "tagger",
            words=words,
            chars=chars,
            tags=tags,
            arch="attention",
            max_chars=MAX_CHARS,
            max_len=64,
            **TINY,
        )
        compile_tagger(
            model,
            3e-3,
            total_steps=100,
            warmup_steps=0,
            weight_decay=1e-4,
            ema_momentum=EMA_MOMENTUM,
        )
    encoded = _encode(model, data)
    index, _ = context.worker()

    def dump(epoch, logs):
        np.savez(
            os.path.join(args.out, f"weights-e{epoch + 1}-w{index}.npz"),
            *[np.asarray(v.numpy()) for v in model.trainable_variables],
        )
        with engine.averaged_weights(model):
            np.savez(
                os.path.join(args.out, f"averaged-e{epoch + 1}-w{index}.npz"),
                *[np.asarray(v.numpy()) for v in model.trainable_variables],
            )
        print(f"epoch {epoch + 1} loss {logs['loss']:.6f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    plan = engine.Plan(
        epochs=args.epochs,
        checkpoint_dir=os.path.join(args.out, "checkpoints"),
        checkpoint_every=2,
        verbose=0,
        validation=Batches(encoded["dev"], 8),
        hooks=(dump,),
        context=context,
    )
    engine.fit(
        make_step(model, context=context),
        lambda e: Batches(encoded["train"], GLOBAL_BATCH, seed=[0, e]),
        plan,
    )
    print("replicas", context.strategy.num_replicas_in_sync, flush=True)


if __name__ == "__main__":
    main()
