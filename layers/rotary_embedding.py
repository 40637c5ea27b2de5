"""Rotary position embedding (RoPE), applied to queries and keys.

Written with `keras.ops`, without NEG, so it converts to TFLite builtins that
also quantize; all tensors stay rank <= 4.
"""

import keras
import numpy as np
from keras import ops

from layers.sinusoidal_position_encoding import position_range
from layers.validation import check_input_rank, check_positive_number, check_start_index


@keras.saving.register_keras_serializable(package="layers")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding, RoPE (Su et al., 2021).

    Rotates each pair of features by an angle proportional to the position, so
    that the dot product of a rotated query and a rotated key depends only on
    their relative position. Uses the half-split ("rotate_half") pairing of
    KerasHub and GPT-NeoX: feature `i` is paired with feature `i + D/2` (not
    with its neighbour `i + 1` as in the paper's interleaved layout), with
    frequency `max_wavelength ** (-2i / D)` for `i < D/2`:

    `y[:D/2] = x[:D/2] * cos - x[D/2:] * sin`,
    `y[D/2:] = x[D/2:] * cos + x[:D/2] * sin`.

    The rotation is written without NEG (a SUB and an ADD), so it converts to
    TFLite builtins that also quantize; all tensors stay rank <= 4.

    Args:
        max_wavelength: positive number, base of the frequencies.
        scaling_factor: positive number; positions are divided by it (linear
            position interpolation for longer contexts). Defaults to 1.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: tensor of shape `[batch, sequence, features]` or
            `[batch, sequence, heads, head_dim]`; the last dimension must be
            even.
        start_index: Python int or scalar integer tensor, the position of the
            first element (the cache position while decoding). Defaults to 0.

    Returns:
        The rotated tensor, of the shape of `inputs` and the compute dtype.

    Example:

    >>> import numpy as np
    >>> q = np.ones((1, 3, 2, 4), "float32")  # [batch, seq, heads, head_dim]
    >>> rotated = RotaryEmbedding()(q, start_index=5)
    >>> tuple(rotated.shape)
    (1, 3, 2, 4)

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [GPT-NeoX](https://github.com/EleutherAI/gpt-neox)
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)
        self.scaling_factor = check_positive_number("scaling_factor", scaling_factor)
        self.supports_masking = True
        self.built = True

    def _check_shape(self, shape):
        check_input_rank(shape, (3, 4), "RotaryEmbedding")
        features = shape[-1]
        if features is None or features % 2:
            raise ValueError(
                "RotaryEmbedding needs an even, known last dimension. "
                f"Received: inputs.shape={tuple(shape)}"
            )

    def cos_sin(self, length, features, start_index=0):
        """Float32 `cos` and `sin` of the angles, each `[length, features/2]`."""
        half = features // 2
        exponents = np.arange(half, dtype="float32") * 2.0 / np.float32(features)
        inverse_freq = np.power(np.float32(self.max_wavelength), -exponents).astype("float32")
        positions = position_range(length, start_index)
        if self.scaling_factor != 1.0:
            positions = positions / np.float32(self.scaling_factor)
        angles = ops.expand_dims(positions, -1) * inverse_freq[None, :]
        return ops.cos(angles), ops.sin(angles)

    def call(self, inputs, start_index=0):
        self._check_shape(inputs.shape)
        check_start_index(start_index, None, None, name=self.name)
        rank = len(inputs.shape)
        features = inputs.shape[-1]
        half = features // 2
        cos, sin = self.cos_sin(ops.shape(inputs)[1], features, start_index)
        # [T, D/2] -> [1, T, D/2] or [1, T, 1, D/2] to broadcast over batch
        # and heads; reshape with -1 needs no SHAPE op and no new-axis slice.
        target = (1, -1, half) if rank == 3 else (1, -1, 1, half)
        cos, sin = ops.reshape(cos, target), ops.reshape(sin, target)
        cos = ops.cast(cos, self.compute_dtype)
        sin = ops.cast(sin, self.compute_dtype)
        x = ops.cast(inputs, self.compute_dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, input_shape):
        self._check_shape(input_shape)
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "scaling_factor": self.scaling_factor,
            }
        )
        return config
