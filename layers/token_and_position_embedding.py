"""Token embedding plus a learned or sinusoidal position embedding."""

import math

import keras
from keras import ops

from layers.position_embedding import PositionEmbedding
from layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from layers.token_embedding import TokenEmbedding
from layers.validation import check_choice, check_input_rank, check_int, check_start_index


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
        self.vocabulary_size = check_int("vocabulary_size", vocabulary_size)
        self.sequence_length = check_int("sequence_length", sequence_length)
        self.embedding_dim = check_int("embedding_dim", embedding_dim)
        self.mask_zero = bool(mask_zero)
        self.position = check_choice("position", position, ("learned", "sinusoidal"))
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
        check_input_rank(input_shape, (2,), "TokenAndPositionEmbedding")
        self.token_embedding.build(input_shape)
        embedded_shape = tuple(input_shape) + (self.embedding_dim,)
        self.position_embedding.build(embedded_shape)

    def call(self, inputs, start_index=0):
        check_input_rank(inputs.shape, (2,), "TokenAndPositionEmbedding")
        check_start_index(start_index, inputs.shape[1], self.sequence_length, name=self.name)
        embedded = self.token_embedding(inputs)
        if self.scale_by_sqrt_dim:
            embedded = embedded * ops.cast(math.sqrt(self.embedding_dim), embedded.dtype)
        positions = self.position_embedding(embedded, start_index=start_index)
        return embedded + positions

    def compute_mask(self, inputs, mask=None):
        return self.token_embedding.compute_mask(inputs, mask)

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, input_shape):
        check_input_rank(input_shape, (2,), "TokenAndPositionEmbedding")
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
