"""`--jit-compile` / `--no-jit-compile` reach the JAX model step as they reach
TensorFlow's: unset, it jits (an un-jitted JAX step runs op by op); `--no-jit-compile`
turns it off. Run in a child under KERAS_BACKEND=jax (`python -m` this module)."""

import argparse
import sys

import pytest

from tests.support.backends import run_under_jax

pytestmark = pytest.mark.slow  # a child process: make test-fast leaves it out


def _step_jits(flag):
    import keras

    from train import strategy
    from train.steps import make_step

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss=keras.losses.MeanSquaredError())
    context = strategy.configure(
        argparse.Namespace(
            strategy="auto",
            tpu=None,
            device="auto",
            mixed_precision="auto",
            jit_compile=flag,
            checkpoint_every=0,
        )
    )
    return make_step(model, context=context).jit_compile


def test_the_jax_step_follows_the_jit_compile_flag():
    stdout = run_under_jax("tests.train.test_jax_step_options", timeout=300)
    assert stdout.split() == ["None:True", "False:False", "True:True"], stdout


if __name__ == "__main__":
    import keras

    assert keras.backend.backend() == "jax", keras.backend.backend()
    for flag in (None, False, True):
        print(f"{flag}:{_step_jits(flag)}")
    sys.stdout.flush()
