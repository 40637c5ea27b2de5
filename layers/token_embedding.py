"""Token embedding that converts to a TFLite GATHER with 1-D int32 indices."""

import keras
from keras import ops

from layers.validation import check_int


def lookup_rows(table, ids):
    """`table[ids]` for non-negative int ids of any shape (a scalar too):
    `ids.shape + table.shape[1:]`.

    The ids are flattened so the lookup converts to a TFLite GATHER with 1-D
    int32 indices, the only form the mobile GPU delegate runs.
    `keras.ops.take` on TensorFlow first maps negative ids with `tf.where`,
    which becomes an int32 SELECT that the delegate rejects. Ids are
    non-negative by contract here, so on TensorFlow the gather is emitted
    directly; other backends use `ops.take` (same result).
    """
    if ids.dtype != "int32":
        ids = ops.cast(ids, "int32")
    flat_ids = ops.reshape(ids, (-1,))
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        rows = tf.gather(table, flat_ids, axis=0)
    else:
        rows = ops.take(table, flat_ids, axis=0)
    lead = tuple(ids.shape) if None not in tuple(ids.shape) else tuple(ops.shape(ids))
    return ops.reshape(rows, lead + tuple(table.shape[1:]))


@keras.saving.register_keras_serializable(package="layers")
class TokenEmbedding(keras.layers.Layer):
    """Token embedding, a drop-in for `keras.layers.Embedding`.

    Same math, weight name (`embeddings`) and weight shape
    `[input_dim, output_dim]` as `keras.layers.Embedding`, so weights can be
    copied either way with `set_weights`. The lookup flattens the ids, gathers
    rows with 1-D int32 indices and reshapes back, which converts to a single
    TFLite `GATHER` that the mobile GPU delegate accepts (Keras's own layer
    gathers with 2-D indices behind an int32 `SELECT`).

    Ids must lie in `[0, input_dim)`. Out-of-range ids raise on TensorFlow CPU
    and give undefined rows in TFLite.

    Args:
        input_dim: positive int, vocabulary size.
        output_dim: positive int, embedding size.
        mask_zero: bool, whether id 0 is padding; then `compute_mask` returns
            `ids != 0`.
        embeddings_initializer: initializer of the table. Defaults to
            `"uniform"` as in `keras.layers.Embedding`.
        embeddings_regularizer: optional regularizer of the table.
        embeddings_constraint: optional constraint of the table.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: integer tensor of ids, any rank (`[batch, sequence]` usually).

    Returns:
        A tensor of shape `inputs.shape + [output_dim]` in the compute dtype.

    Example:

    >>> import numpy as np
    >>> layer = TokenEmbedding(input_dim=10, output_dim=3, mask_zero=True)
    >>> ids = np.array([[4, 2, 0]], "int32")
    >>> tuple(layer(ids).shape)
    (1, 3, 3)
    >>> np.asarray(layer.compute_mask(ids)).tolist()
    [[True, True, False]]
    """

    def __init__(
        self,
        input_dim,
        output_dim,
        mask_zero=False,
        embeddings_initializer="uniform",
        embeddings_regularizer=None,
        embeddings_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.input_dim = check_int("input_dim", input_dim)
        self.output_dim = check_int("output_dim", output_dim)
        self.mask_zero = bool(mask_zero)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = keras.constraints.get(embeddings_constraint)
        self.supports_masking = self.mask_zero

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.input_dim, self.output_dim),
            initializer=self.embeddings_initializer,
            regularizer=self.embeddings_regularizer,
            constraint=self.embeddings_constraint,
            trainable=True,
            # float32 under mixed precision; rows are cast after the gather
            # (cheaper than casting the whole table).
            autocast=False,
        )

    def call(self, inputs):
        rows = lookup_rows(ops.convert_to_tensor(self.embeddings), inputs)
        return ops.cast(rows, self.compute_dtype)

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(inputs, 0)

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "embeddings_regularizer": keras.regularizers.serialize(self.embeddings_regularizer),
                "embeddings_constraint": keras.constraints.serialize(self.embeddings_constraint),
            }
        )
        return config
