"""The training steps of Keras's backend (a compiled model's, SAGAN's), chosen here so
that the TensorFlow and the JAX step modules never import each other."""

import keras


def make_step(model, loss_terms=None, context=None, rate=None):
    """The step for a compiled `model` in the run `context` (train.strategy.RunContext;
    None: one device): `train.model_step.TfModelStep` under TensorFlow,
    `train.jax_step.JaxModelStep` under JAX. `rate`: the learning rate at each step's
    `train.engine.At` (e.g. `engine.warmup_cosine`), or None for the compiled one."""
    if keras.backend.backend() == "jax":
        from train.jax_step import JaxModelStep as Step
    else:
        from train.model_step import TfModelStep as Step
    return Step(model, loss_terms, context=context, rate=rate)


def make_sagan_step(models, recipe, context=None, jit_compile=False):
    """SAGAN's step for (generator, discriminator, EMA generator or None) in the run
    `context`: `train.sagan.fit.TfSaganStep` under TensorFlow,
    `train.sagan.jax_fit.JaxSaganStep` under JAX."""
    if keras.backend.backend() == "jax":
        from train.sagan.jax_fit import JaxSaganStep as Step
    else:
        from train.sagan.fit import TfSaganStep as Step
    return Step(models, recipe, context, jit_compile)
