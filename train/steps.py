"""The training steps of Keras's backend (a compiled model's, SAGAN's), chosen here so
that the TensorFlow and the JAX step modules never import each other; and the float32
model a trained step's model becomes."""

import keras


def make_step(model, loss_terms=None, context=None, rate=None):
    """The backend's step for a compiled `model` (context None: one device). `rate`: the
    learning rate at each `train.engine.At` (`engine.warmup_cosine`); None: the compiled one."""
    if keras.backend.backend() == "jax":
        from train.jax_step import JaxModelStep as Step
    else:
        from train.model_step import TfModelStep as Step
    return Step(model, loss_terms, context=context, rate=rate)


def make_sagan_step(models, recipe, context=None, jit_compile=False):
    """The backend's SAGAN step for (generator, discriminator, EMA generator or None)."""
    if keras.backend.backend() == "jax":
        from train.sagan.jax_fit import JaxSaganStep as Step
    else:
        from train.sagan.fit import TfSaganStep as Step
    return Step(models, recipe, context, jit_compile)


def float32_model(model):
    """The trained `model` as the run evaluates and saves it: the same weights under the
    float32 dtype policy in every layer. A run trained under `--mixed-precision` computes
    in bfloat16 / float16 for speed; its metrics, model.keras and the exports (checked
    against model.keras) are float32. `model` itself when it is float32 already."""
    config = keras.saving.serialize_keras_object(model)
    mixed = []

    def to_float32(node):
        if isinstance(node, dict):
            if node.get("class_name") == "DTypePolicy" and node["config"]["name"] != "float32":
                node["config"]["name"] = "float32"
                mixed.append(node)
            for value in node.values():
                to_float32(value)
        elif isinstance(node, list):
            for value in node:
                to_float32(value)

    to_float32(config)
    # A model's own policy: its config may leave it out (the tagger's follows the global
    # policy at construction), and the global one while the run's still holds.
    policies = {model.dtype_policy.name, keras.config.dtype_policy().name}
    if not mixed and policies == {"float32"}:
        return model
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")  # for the layers a model builds from it
    try:
        copy = keras.saving.deserialize_keras_object(config)
    finally:
        keras.config.set_dtype_policy(before)
    copy.set_weights(model.get_weights())
    return copy
