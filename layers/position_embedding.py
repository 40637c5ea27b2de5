"""A learned table of positions, returned for `start_index ... start_index + T - 1`."""

import keras
from keras import ops

from layers.validation import check_input_rank, check_int, check_start_index, static_int


@keras.saving.register_keras_serializable(package="layers")
class PositionEmbedding(keras.layers.Layer):
    """Learned position embedding for sequences of at most `sequence_length`.

    Holds a trainable table `embeddings` of shape `[sequence_length, features]`
    (features taken from the input at build time) and returns rows
    `start_index ... start_index + T - 1`, broadcast to the input's shape. The
    caller adds it to its inputs.

    Lengths beyond the table: when `T + start_index` is known at trace or eager
    time and exceeds `sequence_length`, the call raises `ValueError`. When the
    length or `start_index` is only known at run time (a `None` sequence
    dimension in an exported graph with a tensor `start_index`), no check is
    possible in the graph: TensorFlow raises `InvalidArgumentError` from the
    slice, and a TFLite model reads out of range (undefined values). Exported
    models should therefore bound their inputs to `sequence_length`.

    Args:
        sequence_length: positive int, the longest supported sequence.
        initializer: initializer of the table. Defaults to `"glorot_uniform"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: tensor of shape `[batch, sequence, features]`; only its shape
            is used.
        start_index: Python int or scalar integer tensor, the position of the
            first element. Defaults to 0.

    Returns:
        A tensor of the shape of `inputs` and the layer's compute dtype.

    Example:

    >>> import numpy as np
    >>> x = np.zeros((2, 5, 8), "float32")
    >>> layer = PositionEmbedding(sequence_length=16)
    >>> tuple(layer(x).shape)
    (2, 5, 8)
    >>> tuple(layer.embeddings.shape)
    (16, 8)

    References:
        - [Devlin et al., 2019](https://arxiv.org/abs/1810.04805)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = check_int("sequence_length", sequence_length)
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, input_shape):
        check_input_rank(input_shape, (3,), "PositionEmbedding")
        features = input_shape[-1]
        if features is None:
            raise ValueError(
                "PositionEmbedding needs a known feature size. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, features),
            initializer=self.initializer,
            trainable=True,
        )

    def call(self, inputs, start_index=0):
        check_input_rank(inputs.shape, (3,), "PositionEmbedding")
        check_start_index(start_index, inputs.shape[1], self.sequence_length, name=self.name)
        shape = ops.shape(inputs)
        table = ops.convert_to_tensor(self.embeddings)
        start, length = static_int(start_index), inputs.shape[1]
        if start is not None and length is not None:
            # Static bounds: the converter folds this into a constant slice.
            rows = table[start : start + length]
        else:
            start = ops.cast(start_index, "int32")
            zero = ops.zeros((), "int32")
            rows = ops.slice(
                table,
                ops.stack([start, zero]),
                ops.stack([ops.cast(shape[1], "int32"), table.shape[1]]),
            )
        rows = ops.cast(rows, self.compute_dtype)
        rows = ops.reshape(rows, (1, -1, table.shape[1]))
        return ops.broadcast_to(rows, shape)

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, input_shape):
        check_input_rank(input_shape, (3,), "PositionEmbedding")
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
