"""Small layers used only by the tagger."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="zoo")
class WordDropout(keras.layers.Layer):
    """Replaces word ids by the unknown id at random during training.

    The model then learns to tag from the character features alone, which is what it
    must do for words it never saw. Padding (id 0) is kept. Identity at inference.

    Args:
        rate: float in [0, 1), probability of replacing a word id.
        unknown_id: int, the id that replaces dropped words.
        seed: optional int seed.

    Call arguments:
        inputs: int tensor of word ids, any shape.
        training: bool, dropout is applied only when True.

    Returns:
        An int tensor of the same shape and dtype.

    Example:

    >>> import numpy as np
    >>> layer = WordDropout(0.5)
    >>> np.asarray(layer(np.array([[3, 4, 0]], "int32"))).tolist()
    [[3, 4, 0]]
    """

    def __init__(self, rate, unknown_id=1, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"`rate` must be in [0, 1). Received: rate={rate!r}")
        self.rate = float(rate)
        self.unknown_id = int(unknown_id)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.built = True

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        keep = keras.random.uniform(ops.shape(inputs), seed=self.seed_generator) >= self.rate
        keep = ops.logical_or(keep, ops.equal(inputs, 0))
        return ops.where(keep, inputs, ops.cast(self.unknown_id, inputs.dtype))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, unknown_id=self.unknown_id, seed=self.seed)
        return config
