"""`python -m train sagan`: train a Self-Attention GAN, or --compare with / without attention.

The data: train/sagan/images.py; the evaluation (FID/KID in the feature space of a
classifier trained on the real images): train/sagan/evaluation.py; one device or any
`--strategy`, `--batch-size` the global batch (docs/distributed.md).
"""

import dataclasses
import os
import time

from train import config
from train.config import VERBOSE, above, at_least, fraction, one_of, option
from zoo.cli import UsageError


@dataclasses.dataclass
class SaganConfig:
    """The options of `python -m train sagan` (train.config). What each default
    contributes, measured against its alternatives: benchmarks/sagan.md, "Design notes"."""

    out: str = option(
        None, "run directory (default runs/sagan or runs/sagan-compare)", kind=str, record=False
    )
    epochs: int = option(
        None,
        "passes over the training images (default 100; --max-minutes usually ends the run first)",
        kind=int,
        check=at_least(0),
        resume=True,
    )
    batch_size: int = option(
        16,
        "real images per D step, split across replicas (global batch; default 16)",
        check=at_least(1),
    )
    n_dis: int = option(1, "D steps per G step (default 1)", check=at_least(1))
    # Equal rates, not SAGAN's TTUR (1e-4 / 4e-4): on a short budget D won every step.
    lr_g: float = option(2e-3, "generator learning rate (default 2e-3)", check=above(0))
    lr_d: float = option(2e-3, "discriminator learning rate (default 2e-3)", check=above(0))
    lr_decay_from: float = option(
        0.5,
        "from this fraction of the budget (--max-minutes or --epochs, whichever ends the "
        "run), both learning rates fall linearly to 0 at its end (default 0.5; 1 = constant)",
        check=lambda v: 0 <= v <= 1 or "must be in [0, 1]",
        metavar="FRACTION",
    )
    keep: str = option(
        "best",
        "the generator model.keras holds: best (the epoch with the lowest quick FID, "
        "--epoch-eval-samples images, among the epochs whose every class the classifier "
        "recognises in >= 90%% of its images, if any) or last (default best)",
        check=one_of("best", "last"),
    )
    beta1: float = option(0.0, "Adam beta_1 (default 0)", check=fraction)
    beta2: float = option(0.99, "Adam beta_2 (default 0.99)", check=fraction)
    ema: float = option(
        0.999,
        "exponential moving average of G's weights (default 0.999; 0 = off)",
        check=fraction,
        metavar="DECAY",
    )
    mode_seeking: float = option(
        0.1,
        "weight of G's mode-seeking term, which keeps the noise from being ignored "
        "(default 0.1; 0 = off)",
        check=at_least(0),
        metavar="WEIGHT",
    )
    class_loss: float = option(
        2.0,
        "weight of the cross-entropy on D's projection class scores (dual projection: "
        "D learns real images' classes, G is pushed towards the class it was asked for; "
        "default 2; 0 = off)",
        check=at_least(0),
        metavar="WEIGHT",
    )
    r1: float = option(
        10.0,
        "weight of the R1 penalty on D's gradient at real images, applied every 4th "
        "D step (default 10; 0 = off)",
        check=at_least(0),
        metavar="GAMMA",
    )
    latent_dim: int = option(128, "noise size (default 128)", check=at_least(1))
    width: int = option(16, "base channel count of G and D (default 16)", check=at_least(1))
    class_embedding: int = option(
        64,
        "size of the class embedding concatenated to G's noise (default 64; 0 = labels act "
        "through the conditional batch norms only)",
        check=at_least(0),
        metavar="DIM",
    )
    attention_resolution: str = option(
        "auto",
        "feature-map side of the attention block: auto (image_size/2), none, or 8, 16, ...",
    )
    unconditional: bool = option(False, "ignore class labels")
    dataset: str = option(None, "tfds:mnist|fashion_mnist|cifar10|celeb_a (downloads)", kind=str)
    image_dir: str = option(None, "directory with one sub-folder of images per class", kind=str)
    image_size: int = option(
        None,
        "resize images to this side (a power of two >= 32; default: the data's own)",
        kind=int,
    )
    train_size: int = option(
        16000, "embedded data: training images (default 16000)", check=at_least(1)
    )
    test_size: int = option(1000, "embedded data: test images (default 1000)", check=at_least(1))
    max_images: int = option(
        None, "tfds / --image-dir: use at most this many", kind=int, check=at_least(4)
    )
    eval_samples: int = option(
        1000,
        "images per set for FID/KID (generated, reference, test; default 1000)",
        check=at_least(1),
    )
    epoch_eval_samples: int = option(
        1000,
        "images for the FID, class accuracy and consistency logged after each epoch "
        "(default 1000; 0 = off)",
        check=at_least(0),
    )
    classifier_epochs: int = option(
        2,
        "epochs of the evaluation classifier (default 2: 16,000 embedded images x 2)",
        check=at_least(1),
    )
    max_minutes: float = option(
        None,
        "stop training after this many minutes (default 12, or less where the data and "
        "the evaluation classifier took so long that 12 would take the run past 14 minutes "
        "in all, so the default run ends within 15 minutes on a slow 2-core CPU; --compare "
        "and several workers: 12; 0 = no limit)",
        kind=float,
        check=at_least(0),
    )
    verbose: str = option(
        "auto",
        "progress output: auto (a bar on a terminal, else one line per epoch), 0 (none), "
        "1 (bar), 2 (one line per epoch)",
        check=VERBOSE,
        resume=True,
    )
    seed: int = option(
        0, "random seed of the models and noise, and of the data unless --data-seed is given"
    )
    data_seed: int = option(
        None,
        "seed of the embedded data (or of the train/test split of other data) and of "
        "the evaluation classifier (default: --seed); with it, --seed S reproduces the "
        "--compare run of model seed S",
        kind=int,
    )
    resume: bool = option(False, "continue the run in --out from its last checkpoint", record=False)
    compare: bool = option(
        False,
        "train with and without attention on the same budget, for --seeds seeds; "
        "report mean and spread of FID, class accuracy and consistency",
        record=False,
    )
    seeds: int = option(
        3,
        "--compare: model seeds per arm (--seed, --seed+1, ...; default 3)",
        check=at_least(1),
        record=False,
    )

    def check(self):
        if self.compare and self.resume:
            raise UsageError("--compare cannot be combined with --resume")
        self.attention()
        if self.image_size is not None:
            from train.sagan.images import check_size

            check_size(self.image_size)
        if self.out is None:
            self.out = os.path.join("runs", "sagan-compare" if self.compare else "sagan")

    def attention(self):
        """--attention-resolution: "auto", None (no attention) or a side."""
        text = str(self.attention_resolution).strip().lower()
        if text in ("auto", "none", "off", "0"):
            return None if text != "auto" else "auto"
        try:
            return int(text)
        except ValueError:
            raise UsageError(
                f"--attention-resolution must be auto, none or an integer, got "
                f"{self.attention_resolution!r}"
            ) from None

    def resolved_data_seed(self):
        """The seed of the data and the evaluation classifier: --data-seed, else --seed."""
        return self.seed if self.data_seed is None else self.data_seed


CONFIG = SaganConfig


def build_trainer(image_size=32, channels=3, num_classes=4, argv=(), context=None):
    """(G, D, EMA-G or None, step, train config) of `python -m train sagan ARGV` on
    images of this shape, built by the command's own builders from its own defaults, so
    the benchmarks time the recipe the command trains (not a copy that drifts).
    Under the backend Keras was imported with, in `context` (train.strategy.RunContext;
    None: one device); the step's batch is `config["batch_size"]`."""
    import types

    from train.cli import build_parser
    from train.sagan.training import _build, _configs, _step

    cfg = config.from_args(SaganConfig, build_parser("sagan").parse_args(list(argv)))
    from train.strategy import RunContext

    data = types.SimpleNamespace(image_size=image_size, channels=channels, num_classes=num_classes)
    model_cfg, train_cfg = _configs(cfg, data)
    context = context or RunContext()
    g, d, ema = _build(context, model_cfg, train_cfg)
    return g, d, ema, _step(context, (g, d, ema), model_cfg, train_cfg), train_cfg


def _load(cfg):
    from train.sagan.images import load_images

    data = load_images(cfg)
    if cfg.attention() not in ("auto", None):
        from zoo.sagan.model import resolve_attention

        try:
            resolve_attention(data.image_size, cfg.attention())
        except ValueError as e:
            raise UsageError(f"--attention-resolution {cfg.attention()}: {e}") from None
    return data


def run(args, context):
    # The default budget counts the whole run (data, classifier) from here.
    started = time.monotonic()
    cfg = config.from_args(SaganConfig, args)
    from train import rundir

    data = rundir.prepare(cfg, ("sagan",), _load)
    from train.sagan import training

    if cfg.resume:
        return training.resume_run(context, cfg)
    training.check_replicas(context, cfg.batch_size)
    if cfg.compare:
        return training.train_compare(context, cfg, data)
    return training.train_one(context, cfg, data, cfg.out, started=started)
