"""Positional information for sequence models.

Four layers, all written with `keras.ops` so they run on any backend and
convert to TFLite builtin ops (no Flex), with rank <= 4 everywhere:

- `SinusoidalPositionEncoding`: the fixed sin/cos encoding of Vaswani et al.
- `PositionEmbedding`: a learned table of `sequence_length` positions.
- `TokenAndPositionEmbedding`: token embedding plus either of the above.
- `RotaryEmbedding`: rotary position embedding (RoPE) applied to queries/keys.

Every `call` takes `start_index`, a Python int or a scalar integer tensor, the
position of the first element of `inputs` (the cache position while decoding).
"""

import math

import keras
import numpy as np
from keras import ops

from layers.embedding import TokenEmbedding

_POSITION_KINDS = ("learned", "sinusoidal")


def static_int(value):
    """Returns `value` as a Python int when it is known now, else `None`.

    Python ints, NumPy integers and eager scalar tensors are known; symbolic
    tensors inside a traced function are not.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return int(value)
    try:
        array = ops.convert_to_numpy(value)
    except Exception:  # symbolic tensor: the value is a run-time quantity
        return None
    if np.ndim(array) != 0:
        return None
    return int(array)


def check_start_index(start_index, sequence_length, max_length, *, name):
    """Raises ValueError when `start_index + sequence_length > max_length`.

    Only checks what is known statically; see the layer docstrings for the
    behaviour with run-time lengths.
    """
    start = static_int(start_index)
    if start is not None and start < 0:
        raise ValueError(f"`start_index` must be >= 0. Received: start_index={start}")
    if max_length is None or sequence_length is None or start is None:
        return
    if start + sequence_length > max_length:
        raise ValueError(
            f"{name}: the input sequence (length {sequence_length} starting at "
            f"start_index={start}, i.e. {start + sequence_length} positions) "
            f"is longer than `sequence_length={max_length}`. Received: "
            f"length={start + sequence_length}"
        )


def _check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value}")


def _check_positive_number(value, name):
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")


def _check_rank(input_shape, ranks, layer_name, what="inputs"):
    if len(input_shape) not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"{layer_name} expects `{what}` of rank {expected}. Received: "
            f"{what}.shape={tuple(input_shape)} (rank {len(input_shape)})"
        )


def _positions(length, start_index):
    """Float32 positions `start_index, ..., start_index + length - 1`."""
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

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        _check_positive_number(max_wavelength, "max_wavelength")
        self.max_wavelength = max_wavelength
        self.supports_masking = True
        self.built = True

    def encoding(self, length, features, start_index=0):
        """Float32 encoding of shape `[length, features]`."""
        positions = _positions(length, start_index)
        # Features 2k and 2k + 1 share the frequency max_wavelength^(-2k/D).
        index = np.arange(features)
        exponents = (2 * (index // 2)).astype("float32") / np.float32(features)
        inverse_freq = np.power(np.float32(self.max_wavelength), -exponents).astype("float32")
        angles = ops.expand_dims(positions, -1) * inverse_freq[None, :]
        is_cos = (index % 2).astype("float32")[None, :]
        return ops.sin(angles) * (1.0 - is_cos) + ops.cos(angles) * is_cos

    def call(self, inputs, start_index=0):
        _check_rank(inputs.shape, (3,), "SinusoidalPositionEncoding")
        check_start_index(start_index, None, None, name=self.name)
        shape = ops.shape(inputs)
        features = inputs.shape[-1]
        if features is None:
            raise ValueError(
                "SinusoidalPositionEncoding needs a known feature size. "
                f"Received: inputs.shape={tuple(inputs.shape)}"
            )
        encoding = self.encoding(shape[1], features, start_index)
        encoding = ops.cast(encoding, self.compute_dtype)
        # reshape, not expand_dims: EXPAND_DIMS is not a mobile-GPU op.
        encoding = ops.reshape(encoding, (1, -1, features))
        return ops.broadcast_to(encoding, shape)

    def compute_output_shape(self, input_shape):
        _check_rank(input_shape, (3,), "SinusoidalPositionEncoding")
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
        return config


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
        _check_positive_int(sequence_length, "sequence_length")
        self.sequence_length = int(sequence_length)
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, input_shape):
        _check_rank(input_shape, (3,), "PositionEmbedding")
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
        _check_rank(inputs.shape, (3,), "PositionEmbedding")
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

    def compute_output_shape(self, input_shape):
        _check_rank(input_shape, (3,), "PositionEmbedding")
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


@keras.saving.register_keras_serializable(package="layers")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a position embedding (added, not concatenated).

    The token lookup is a `TokenEmbedding` (a 1-D gather, which the TFLite
    mobile GPU delegate accepts); the position part is a learned
    `PositionEmbedding` or a fixed `SinusoidalPositionEncoding`. Sequences
    longer than `sequence_length` raise `ValueError` for both kinds when the
    length is known statically (see `PositionEmbedding` for run-time lengths).

    Args:
        vocabulary_size: positive int, number of token ids.
        sequence_length: positive int, the longest supported sequence.
        embedding_dim: positive int, size of each embedding.
        mask_zero: bool, whether id 0 is padding; the layer then returns the
            mask `ids != 0` (`compute_mask`).
        position: `"learned"` or `"sinusoidal"`.
        scale_by_sqrt_dim: bool, multiply token embeddings by
            `sqrt(embedding_dim)` before adding positions (Vaswani et al.).
        embeddings_initializer: initializer of the token table (and of the
            learned position table). Defaults to `"uniform"` as in
            `keras.layers.Embedding`.
        max_wavelength: base of the sinusoidal encoding (ignored when
            `position="learned"`).
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: integer tensor of token ids, shape `[batch, sequence]`.
        start_index: Python int or scalar integer tensor, the position of the
            first token. Defaults to 0.

    Returns:
        A float tensor of shape `[batch, sequence, embedding_dim]`.

    Example:

    >>> import numpy as np
    >>> ids = np.array([[5, 3, 0, 0]], "int32")
    >>> layer = TokenAndPositionEmbedding(
    ...     vocabulary_size=10, sequence_length=8, embedding_dim=4,
    ...     mask_zero=True)
    >>> tuple(layer(ids).shape)
    (1, 4, 4)
    >>> np.asarray(layer.compute_mask(ids)).tolist()
    [[True, True, False, False]]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        embedding_dim,
        mask_zero=False,
        position="learned",
        scale_by_sqrt_dim=False,
        embeddings_initializer="uniform",
        max_wavelength=10000,
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_positive_int(vocabulary_size, "vocabulary_size")
        _check_positive_int(sequence_length, "sequence_length")
        _check_positive_int(embedding_dim, "embedding_dim")
        if position not in _POSITION_KINDS:
            raise ValueError(
                f"`position` must be one of {_POSITION_KINDS}. Received: position={position!r}"
            )
        self.vocabulary_size = int(vocabulary_size)
        self.sequence_length = int(sequence_length)
        self.embedding_dim = int(embedding_dim)
        self.mask_zero = bool(mask_zero)
        self.position = position
        self.scale_by_sqrt_dim = bool(scale_by_sqrt_dim)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.max_wavelength = max_wavelength
        self.token_embedding = TokenEmbedding(
            self.vocabulary_size,
            self.embedding_dim,
            mask_zero=self.mask_zero,
            embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        if position == "learned":
            self.position_embedding = PositionEmbedding(
                self.sequence_length,
                initializer=keras.initializers.get(
                    keras.initializers.serialize(self.embeddings_initializer)
                ),
                dtype=self.dtype_policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionEncoding(
                max_wavelength=max_wavelength,
                dtype=self.dtype_policy,
                name="position_embedding",
            )
        self.supports_masking = self.mask_zero

    def build(self, input_shape):
        _check_rank(input_shape, (2,), "TokenAndPositionEmbedding")
        self.token_embedding.build(input_shape)
        embedded_shape = tuple(input_shape) + (self.embedding_dim,)
        self.position_embedding.build(embedded_shape)

    def call(self, inputs, start_index=0):
        _check_rank(inputs.shape, (2,), "TokenAndPositionEmbedding")
        check_start_index(start_index, inputs.shape[1], self.sequence_length, name=self.name)
        embedded = self.token_embedding(inputs)
        if self.scale_by_sqrt_dim:
            embedded = embedded * ops.cast(math.sqrt(self.embedding_dim), embedded.dtype)
        positions = self.position_embedding(embedded, start_index=start_index)
        return embedded + positions

    def compute_mask(self, inputs, mask=None):
        return self.token_embedding.compute_mask(inputs, mask)

    def compute_output_shape(self, input_shape):
        _check_rank(input_shape, (2,), "TokenAndPositionEmbedding")
        return tuple(input_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "sequence_length": self.sequence_length,
                "embedding_dim": self.embedding_dim,
                "mask_zero": self.mask_zero,
                "position": self.position,
                "scale_by_sqrt_dim": self.scale_by_sqrt_dim,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "max_wavelength": self.max_wavelength,
            }
        )
        return config


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
        _check_positive_number(max_wavelength, "max_wavelength")
        _check_positive_number(scaling_factor, "scaling_factor")
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.supports_masking = True
        self.built = True

    def _check_shape(self, shape):
        _check_rank(shape, (3, 4), "RotaryEmbedding")
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
        positions = _positions(length, start_index)
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
