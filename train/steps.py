"""The training steps of Keras's backend (a compiled model's, SAGAN's), chosen here so
that the TensorFlow and the JAX step modules never import each other."""

import keras


def make_step(model, loss_terms=None, jit_compile=None):
    """The step for a compiled `model`: `train.model_step.TfModelStep` under TensorFlow,
    `train.jax_step.JaxModelStep` under JAX."""
    if keras.backend.backend() == "jax":
        from train.jax_step import JaxModelStep

        return JaxModelStep(model, loss_terms, jit_compile)
    from train.model_step import TfModelStep

    return TfModelStep(model, loss_terms, jit_compile)


def make_sagan_step(models, recipe, strategy=None, jit_compile=False):
    """SAGAN's step for (generator, discriminator, EMA generator or None):
    `train.sagan.fit.TfSaganStep` under TensorFlow, `train.sagan.jax_fit.JaxSaganStep`
    under JAX."""
    if keras.backend.backend() == "jax":
        from train.sagan.jax_fit import JaxSaganStep as Step
    else:
        from train.sagan.fit import TfSaganStep as Step
    return Step(models, recipe, strategy, jit_compile)
