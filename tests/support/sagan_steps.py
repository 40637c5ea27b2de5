"""A few SAGAN training steps from given weights, under whichever Keras backend runs it.

`python -m tests.support.sagan_steps WEIGHTS_IN WEIGHTS_OUT` (under `KERAS_BACKEND=jax`,
tests/support/backends.py) loads a tiny class-conditional G and D's variables from
WEIGHTS_IN, runs `STEPS` D steps (every one a G step and an EMA step too) with the R1
penalty on, so the last D step carries it, and writes every G and D variable to
WEIGHTS_OUT (plain SGD: see `run`). The TensorFlow side of the comparison calls `run`
in the test process.
"""

import sys

import numpy as np

STEPS = 4  # train.sagan.losses.R1_EVERY: the fourth D step is an R1 step
ROWS = 4
LATENT = 4
CLASSES = 3


def build():
    import keras

    import zoo

    keras.utils.set_random_seed(0)
    cfg = {"image_size": 32, "channels": 3, "num_classes": CLASSES, "width": 4, "seed": 0}
    g = zoo.build("sagan_generator", latent_dim=LATENT, class_embedding=2, **cfg)
    d = zoo.build("sagan_discriminator", **cfg)
    ema = zoo.build("sagan_generator", latent_dim=LATENT, class_embedding=2, **cfg)
    return g, d, ema


def recipe(**overrides):
    """The training settings of these steps (`SaganStep`'s recipe)."""
    import types

    settings = dict(
        num_classes=CLASSES,
        latent_dim=LATENT,
        lr_g=1e-4,
        lr_d=4e-4,
        beta1=0.0,
        beta2=0.9,
        n_dis=1,
        ema=0.999,
        seed=0,
        mode_seeking=0.1,
        class_loss=1.0,
        r1=10.0,
        lr_decay_from=1.0,
    )
    return types.SimpleNamespace(**{**settings, **overrides})


def variables(g, d):
    return list(g.variables) + list(d.variables)


def run(weights, r1=10.0):
    """Loads `weights` (one array per variable of `variables(g, d)`), trains STEPS steps
    with R1 weight `r1` and returns the variables' values after them."""
    import keras

    from train.engine import At
    from train.steps import make_sagan_step as make_step

    g, d, ema = build()
    for v, value in zip(variables(g, d), weights):
        v.assign(value)
    ema.set_weights(g.get_weights())
    # TensorFlow: a plain tf.function; JAX: jitted (its default).
    trainer = make_step((g, d, ema), recipe(r1=r1), jit_compile=None)
    # Plain SGD instead of the trainer's Adam: Adam divides by each gradient's RMS, so
    # rounding in a near-zero gradient (G's biases before a batch norm have one) becomes
    # a whole step, where SGD keeps it at rounding size.
    for name, model in (("g_opt", g), ("d_opt", d)):
        optimizer = keras.optimizers.SGD(1e-2)
        optimizer.build(model.trainable_variables)
        setattr(trainer, name, optimizer)
    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, (ROWS, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, CLASSES, ROWS).astype(np.int32)
    for step in range(STEPS):
        trainer.train((real, labels), At(step, 0.0))
    return [keras.ops.convert_to_numpy(v.value) for v in variables(g, d)]


def main(argv):
    source, target = argv
    with np.load(source) as saved:
        weights = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    np.savez(target, *run(weights))


if __name__ == "__main__":
    main(sys.argv[1:])
