"""The training step of Keras's backend, kept apart from both step modules so neither
imports the other."""

import keras


def make_step(model, loss_terms=None, jit_compile=None):
    """The step for a compiled `model`: `train.model_step.TfModelStep` under TensorFlow,
    `train.jax_step.JaxModelStep` under JAX."""
    if keras.backend.backend() == "jax":
        from train.jax_step import JaxModelStep

        return JaxModelStep(model, loss_terms, jit_compile)
    from train.model_step import TfModelStep

    return TfModelStep(model, loss_terms, jit_compile)
