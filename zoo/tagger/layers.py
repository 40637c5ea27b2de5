"""Small layers used only by the tagger."""

import keras
import numpy as np
from keras import ops

from layers.token_embedding import lookup_rows
from layers.validation import check_int, check_rate


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
        self.rate = check_rate("rate", rate)
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


@keras.saving.register_keras_serializable(package="zoo")
class Presence(keras.layers.Layer):
    """1.0 where an id is a real token (id > 0), 0.0 on padding, as floats.

    A lookup in a constant 0/1 table instead of `ids > 0`: a comparison on the raw
    integer model input makes TFLite's int16x8 quantizer ask for that input's float
    range (and fail), and the bool -> float cast is a float island in a full-int8
    model. The lookup is a 1-D GATHER, which the mobile GPU delegate runs.

    Args:
        size: int, number of ids (the table the ids index).

    Call arguments:
        inputs: int tensor of ids in `[0, size)`, any shape.

    Returns:
        A float tensor of the same shape: 0.0 where the id is 0, else 1.0.

    Example:

    >>> import numpy as np
    >>> np.asarray(Presence(5)(np.array([[3, 4, 0]], "int32"))).tolist()
    [[1.0, 1.0, 0.0]]
    """

    def __init__(self, size, **kwargs):
        super().__init__(**kwargs)
        self.size = check_int("size", size)

    def call(self, inputs):
        table = np.ones((self.size,), "float32")
        table[0] = 0.0
        return lookup_rows(ops.convert_to_tensor(table, dtype=self.compute_dtype), inputs)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "size": self.size}
