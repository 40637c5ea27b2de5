"""The fixed sin/cos position encoding of Vaswani et al.

Written with `keras.ops`, so it runs on any backend and converts to TFLite
builtin ops (no Flex), with rank <= 4 everywhere.
"""

import keras
import numpy as np
from keras import ops

from layers.validation import check_input_rank, check_positive_number, check_start_index, static_int


def position_range(length, start_index):
    """Float32 positions `start_index, ..., start_index + length - 1`.

    `start_index` is a Python int or a scalar integer tensor, the position of
    the first element (the cache position while decoding)."""
    positions = ops.arange(length, dtype="float32")
    if static_int(start_index) == 0:
        return positions
    return positions + ops.cast(start_index, "float32")


@keras.saving.register_keras_serializable(package="layers")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encoding (Vaswani et al., 2017).

    For position `pos` and feature `i` of `D` features:
    `PE[pos, 2k] = sin(pos / max_wavelength ** (2k / D))` and
    `PE[pos, 2k + 1] = cos(pos / max_wavelength ** (2k / D))`. An odd `D` is
    allowed: its last feature is the sine of the last frequency. Any sequence
    length works. The layer has no weights and returns the encoding, not the
    sum: the caller adds it to its inputs (as KerasHub does).

    Positions are `start_index, start_index + 1, ...` by default; `positions`
    gives each example its own (any real values, e.g. the sorted random
    positions of Ruoss et al., 2023, or positions counted from the end).

    Args:
        max_wavelength: positive number, the longest wavelength (the base
            `10000` of the paper).
        **kwargs: other keyword arguments passed to `keras.layers.Layer`
            (`name`, `dtype`, ...).

    Call arguments:
        inputs: tensor of shape `[batch, sequence, features]`; only its shape
            is used.
        start_index: Python int or scalar integer tensor, the position of the
            first element (used while decoding with a cache). Defaults to 0.
        positions: optional `[batch, sequence]` tensor (integer or float), the
            position of every element; replaces `start_index`.

    Returns:
        A tensor of the shape of `inputs` and the layer's compute dtype.

    Example:

    >>> import numpy as np
    >>> x = np.zeros((2, 5, 8), "float32")
    >>> encoding = SinusoidalPositionEncoding()(x)
    >>> tuple(encoding.shape)
    (2, 5, 8)
    >>> float(encoding[0, 0, 1])  # cos(0)
    1.0
    >>> own = SinusoidalPositionEncoding()(x, positions=np.array([[0, 3, 9, 10, 40]] * 2))
    >>> bool(np.allclose(own[0, 1], SinusoidalPositionEncoding()(x, start_index=3)[0, 0]))
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Ruoss et al., 2023](https://arxiv.org/abs/2305.16843) (random positions)
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)
        self.supports_masking = True
        self.built = True

    def encoding(self, length, features, start_index=0):
        """Float32 encoding of shape `[length, features]`."""
        return self.encode_positions(position_range(length, start_index), features)

    def encode_positions(self, positions, features):
        """Float32 encoding `[..., features]` of positions of any shape `[...]`."""
        positions = ops.cast(positions, "float32")
        # Features 2k and 2k + 1 share the frequency max_wavelength^(-2k/D).
        index = np.arange(features)
        exponents = (2 * (index // 2)).astype("float32") / np.float32(features)
        inverse_freq = np.power(np.float32(self.max_wavelength), -exponents).astype("float32")
        angles = ops.expand_dims(positions, -1) * inverse_freq
        is_cos = (index % 2).astype("float32")
        return ops.sin(angles) * (1.0 - is_cos) + ops.cos(angles) * is_cos

    def call(self, inputs, start_index=0, positions=None):
        check_input_rank(inputs.shape, (3,), "SinusoidalPositionEncoding")
        check_start_index(start_index, None, None, name=self.name)
        shape = ops.shape(inputs)
        features = inputs.shape[-1]
        if features is None:
            raise ValueError(
                "SinusoidalPositionEncoding needs a known feature size. "
                f"Received: inputs.shape={tuple(inputs.shape)}"
            )
        if positions is not None:
            if len(positions.shape) != 2:
                raise ValueError(
                    "`positions` must be `[batch, sequence]`. "
                    f"Received: positions.shape={tuple(positions.shape)}"
                )
            encoding = ops.cast(self.encode_positions(positions, features), self.compute_dtype)
            return ops.broadcast_to(encoding, shape)
        encoding = self.encoding(shape[1], features, start_index)
        encoding = ops.cast(encoding, self.compute_dtype)
        # reshape, not expand_dims: EXPAND_DIMS is not a mobile-GPU op.
        encoding = ops.reshape(encoding, (1, -1, features))
        return ops.broadcast_to(encoding, shape)

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, input_shape):
        check_input_rank(input_shape, (3,), "SinusoidalPositionEncoding")
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
        return config
