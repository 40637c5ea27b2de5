"""`python -m train sagan`: train a Self-Attention GAN, or --compare with / without attention.

Data: the embedded mirrored-shapes set by default (generated, offline),
`--dataset tfds:mnist|fashion_mnist|cifar10|celeb_a` (downloads), or
`--image-dir DIR` (one sub-folder per class). Evaluation: FID/KID in the feature
space of a classifier trained on the real training images (kept in the run
directory), with the real-train vs real-test distance as `fid_floor`.

Runs on one device or under any `--strategy` (mirrored GPUs, several workers, TPU),
with `--batch-size` the global batch split across the replicas (docs/distributed.md).
"""

import os
import time

from zoo.cli import UsageError


def add_arguments(parser):
    add = parser.add_argument
    add("--out", default=None, help="run directory (default runs/sagan or runs/sagan-compare)")
    add(
        "--epochs",
        type=int,
        default=None,
        help="passes over the training images (default 100; --max-minutes usually ends the run first)",
    )
    # 16, not 32: a D step's time is linear in the batch here (compute-bound), so 16 buys
    # twice the steps, and with 2e-3 it reached FID 34 in the budget where 32 at 1e-3
    # reached 64 (benchmarks/sagan.md, session 18).
    add(
        "--batch-size",
        type=int,
        default=16,
        help="real images per D step, split across replicas (global batch; default 16)",
    )
    add("--n-dis", type=int, default=1, help="D steps per G step (default 1)")
    # Not SAGAN's TTUR (1e-4 / 4e-4): on a short budget D won every step (d_loss ~0) and G
    # learned slowly; equal rates kept the game balanced. Without R1, 4e-4 was worse than
    # 2e-4; with it, 1e-3 reached in 1,500 D steps the FID 2e-4 had at 3,000
    # (benchmarks/sagan.md, session 14); 2e-3 beat 1e-3 at fixed steps on every seed
    # measured (sessions 15, 17, 18).
    add("--lr-g", type=float, default=2e-3, help="generator learning rate (default 2e-3)")
    add("--lr-d", type=float, default=2e-3, help="discriminator learning rate (default 2e-3)")
    # 0.5: the default run's FID fell from 34.8 to 28.9 (4.9x the floor) on one CPU; from
    # 0.25 D won the last epoch (30.0). Not a clear gain on other seeds (one better, one
    # worse at fixed steps); at 2e-4 without R1 any decay let D win (benchmarks/sagan.md,
    # sessions 7 and 19).
    add(
        "--lr-decay-from",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="from this fraction of the budget (--max-minutes or --epochs, whichever ends the "
        "run), both learning rates fall linearly to 0 at its end (default 0.5; 1 = constant)",
    )
    add(
        "--keep",
        choices=("best", "last"),
        default="best",
        help="the generator model.keras holds: best (the epoch with the lowest quick FID, "
        "--epoch-eval-samples images, among the epochs whose every class the classifier "
        "recognises in >= 90%% of its images, if any) or last (default best)",
    )
    add("--beta1", type=float, default=0.0, help="Adam beta_1 (default 0)")
    # 0.99, not SAGAN's 0.9: at 2e-3 the steadier step size put all three model seeds of
    # the compare within 5x the FID floor (0.9: one seed stalled at 16.8x; benchmarks/
    # sagan.md, session 21).
    add("--beta2", type=float, default=0.99, help="Adam beta_2 (default 0.99)")
    add(
        "--ema",
        type=float,
        default=0.999,
        metavar="DECAY",
        help="exponential moving average of G's weights (default 0.999; 0 = off)",
    )
    add(
        "--mode-seeking",
        type=float,
        default=0.1,
        metavar="WEIGHT",
        help="weight of G's mode-seeking term, which keeps the noise from being ignored "
        "(default 0.1; 0 = off)",
    )
    add(
        "--class-loss",
        type=float,
        default=2.0,
        metavar="WEIGHT",
        help="weight of the cross-entropy on D's projection class scores (dual projection: "
        "D learns real images' classes, G is pushed towards the class it was asked for; "
        "default 2; 0 = off)",
    )
    # On by default: without it the per-epoch FID swung between 230 and 760 on one CPU.
    # 10: the lowest FID on the default seed, 1: the better mean over two seeds; 0.1 did
    # little (benchmarks/sagan.md, session 13).
    add(
        "--r1",
        type=float,
        default=10.0,
        metavar="GAMMA",
        help="weight of the R1 penalty on D's gradient at real images, applied every 4th "
        "D step (default 10; 0 = off)",
    )
    add("--latent-dim", type=int, default=128, help="noise size (default 128)")
    add("--width", type=int, default=16, help="base channel count of G and D (default 16)")
    add(
        "--class-embedding",
        type=int,
        default=64,
        metavar="DIM",
        help="size of the class embedding concatenated to G's noise (default 64; 0 = labels act "
        "through the conditional batch norms only)",
    )
    add(
        "--attention-resolution",
        default="auto",
        help="feature-map side of the attention block: auto (image_size/2), none, or 8, 16, ...",
    )
    add("--unconditional", action="store_true", help="ignore class labels")
    add("--dataset", help="tfds:mnist|fashion_mnist|cifar10|celeb_a (downloads)")
    add("--image-dir", help="directory with one sub-folder of images per class")
    add(
        "--image-size",
        type=int,
        default=None,
        help="resize images to this side (a power of two >= 32; default: the data's own)",
    )
    # 16,000: with 4,000, D saw each image ~50 times in the budget and classes swung late.
    add(
        "--train-size",
        type=int,
        default=16000,
        help="embedded data: training images (default 16000)",
    )
    add("--test-size", type=int, default=1000, help="embedded data: test images (default 1000)")
    add("--max-images", type=int, default=None, help="tfds / --image-dir: use at most this many")
    add(
        "--eval-samples",
        type=int,
        default=1000,
        help="images per set for FID/KID (generated, reference, test; default 1000)",
    )
    add(
        "--epoch-eval-samples",
        type=int,
        default=1000,
        help="images for the FID, class accuracy and consistency logged after each epoch "
        "(default 1000; 0 = off)",
    )
    add(
        "--classifier-epochs",
        type=int,
        default=2,
        help="epochs of the evaluation classifier (default 2: 16,000 embedded images x 2)",
    )
    add(
        "--max-minutes",
        type=float,
        default=None,
        help="stop training after this many minutes (default 12, or less where the data and "
        "the evaluation classifier took so long that 12 would take the run past 14 minutes "
        "in all, so the default run ends within 15 minutes on a slow 2-core CPU; --compare "
        "and several workers: 12; 0 = no limit)",
    )
    add(
        "--verbose",
        default="auto",
        help="progress output: auto (a bar on a terminal, else one line per epoch), 0 (one "
        "line per epoch), 1 (bar), 2 (one line per epoch)",
    )
    add(
        "--seed",
        type=int,
        default=0,
        help="random seed of the models and noise, and of the data unless --data-seed is given",
    )
    add(
        "--data-seed",
        type=int,
        default=None,
        help="seed of the embedded data (or of the train/test split of other data) and of "
        "the evaluation classifier (default: --seed); with it, --seed S reproduces the "
        "--compare run of model seed S",
    )
    add("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add(
        "--compare",
        action="store_true",
        help="train with and without attention on the same budget, for --seeds seeds; "
        "report mean and spread of FID, class accuracy and consistency",
    )
    add(
        "--seeds",
        type=int,
        default=3,
        help="--compare: model seeds per arm (--seed, --seed+1, ...; default 3)",
    )


def parse_attention(value):
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text in ("none", "off", "0"):
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(
            f"--attention-resolution must be auto, none or an integer, got {value!r}"
        ) from None


def _validate(args):
    positive = {
        "--batch-size": args.batch_size,
        "--n-dis": args.n_dis,
        "--latent-dim": args.latent_dim,
        "--width": args.width,
        "--train-size": args.train_size,
        "--test-size": args.test_size,
        "--eval-samples": args.eval_samples,
        "--seeds": args.seeds,
        "--classifier-epochs": args.classifier_epochs,
    }
    for flag, value in positive.items():
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.class_embedding < 0:
        raise UsageError(f"--class-embedding must be >= 0, got {args.class_embedding}")
    if args.epochs is not None and args.epochs < 0:
        raise UsageError(f"--epochs must be >= 0, got {args.epochs}")
    for flag, value in (("--lr-g", args.lr_g), ("--lr-d", args.lr_d)):
        if not value > 0:
            raise UsageError(f"{flag} must be > 0, got {value}")
    if not 0 <= args.lr_decay_from <= 1:
        raise UsageError(f"--lr-decay-from must be in [0, 1], got {args.lr_decay_from}")
    for flag, value in (("--beta1", args.beta1), ("--beta2", args.beta2), ("--ema", args.ema)):
        if not 0 <= value < 1:
            raise UsageError(f"{flag} must be in [0, 1), got {value}")
    if str(args.verbose) not in ("auto", "0", "1", "2"):
        raise UsageError(f"--verbose must be auto, 0, 1 or 2, got {args.verbose!r}")
    if not args.class_loss >= 0:
        raise UsageError(f"--class-loss must be >= 0, got {args.class_loss}")
    if not args.mode_seeking >= 0:
        raise UsageError(f"--mode-seeking must be >= 0, got {args.mode_seeking}")
    if not args.r1 >= 0:
        raise UsageError(f"--r1 must be >= 0, got {args.r1}")
    if args.max_minutes is not None and args.max_minutes < 0:
        raise UsageError(f"--max-minutes must be >= 0, got {args.max_minutes}")
    if args.epoch_eval_samples < 0:
        raise UsageError(f"--epoch-eval-samples must be >= 0, got {args.epoch_eval_samples}")
    if args.max_images is not None and args.max_images < 4:
        raise UsageError(f"--max-images must be >= 4, got {args.max_images}")
    if args.compare and args.resume:
        raise UsageError("--compare cannot be combined with --resume")
    args.attention = parse_attention(args.attention_resolution)
    if args.image_size is not None:
        from train.sagan.images import check_size

        check_size(args.image_size)
    if args.out is None:
        args.out = os.path.join("runs", "sagan-compare" if args.compare else "sagan")


def build_trainer(image_size=32, channels=3, num_classes=4, argv=()):
    """(G, D, EMA-G or None, trainer, train config) of `python -m train sagan ARGV` on
    images of this shape, built by the command's own builders from its own defaults, so
    the benchmarks time the recipe the command trains (not a copy that drifts).
    Under the backend Keras was imported with; the trainer's batch is
    `config["batch_size"]`."""
    import argparse
    import types

    parser = argparse.ArgumentParser(prog="train sagan")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    _validate(args)
    from train.sagan.training import _build, _model_config, _step, _train_config

    data = types.SimpleNamespace(image_size=image_size, channels=channels, num_classes=num_classes)
    model_cfg = _model_config(args, data, args.attention)
    train_cfg = _train_config(args)
    g, d, ema = _build(model_cfg, train_cfg)
    return g, d, ema, _step((g, d, ema), model_cfg, train_cfg), train_cfg


def run(args):
    # The default budget counts the whole run (data, classifier) from here.
    args.started = time.monotonic()
    _validate(args)
    from train import rundir

    rundir.check_out_dir(args.out, resume=args.resume, kinds=("sagan",))
    if args.resume:
        from zoo.cli import import_keras_quietly

        import_keras_quietly()  # after the cheap checks: bad input still gets one line
        from train.sagan.training import resume_run

        return resume_run(args)
    # Everything that can be wrong with the input is found before anything is written.
    from train.sagan.images import data_flags, load_images

    data = load_images(**data_flags(args))
    if args.attention not in ("auto", None):
        from zoo.sagan.model import resolve_attention

        try:
            resolve_attention(data.image_size, args.attention)
        except ValueError as e:
            raise UsageError(f"--attention-resolution {args.attention}: {e}") from None
    from zoo.cli import import_keras_quietly

    import_keras_quietly()  # after the cheap checks: bad input still gets one line
    from train.sagan.training import check_replicas, train_compare, train_one

    check_replicas(args.batch_size)

    if args.compare:
        return train_compare(args, data)
    return train_one(args, data, args.out)
