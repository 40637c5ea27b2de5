"""Layer normalization written for TFLite quantization and mobile GPUs."""

import keras
from keras import ops

from layers.validation import check_axis, check_positive_number


@keras.saving.register_keras_serializable(package="layers")
class LayerNorm(keras.layers.Layer):
    """Layer normalization (Ba et al., 2016), friendly to TFLite.

    Numerically the same as `keras.layers.LayerNormalization` (with the same
    `epsilon`), with the same weights (`gamma`, `beta`, same shapes), so
    weights copy either way. It is computed as

    `(x - mean) * rsqrt(var + epsilon) * gamma + beta`, `var = mean((x - mean)^2)`

    which converts to MEAN, SUB, MUL, ADD and RSQRT only. Keras's version
    computes `-mean * inv` (a NEG, left in float by full-int8 quantization and
    rejected by int16x8) and multiplies a `[B, T, 1]` tensor by a `[D]` one;
    here every broadcast has one side already of the output's shape, and the
    model quantizes fully to int8 and to int16x8.

    Statistics are computed in float32 also under mixed precision; the output
    has the compute dtype.

    Args:
        epsilon: small positive float added to the variance. Defaults to 1e-5
            (note: `keras.layers.LayerNormalization` defaults to 1e-3).
        center: bool, add the learned offset `beta`.
        scale: bool, multiply by the learned scale `gamma`.
        axis: int or list of ints, the axes to normalize over.
        beta_initializer: initializer of `beta`. Defaults to `"zeros"`.
        gamma_initializer: initializer of `gamma`. Defaults to `"ones"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor of any rank.

    Returns:
        The normalized tensor, same shape, in the compute dtype.

    Example:

    >>> import numpy as np
    >>> x = np.array([[[1.0, 2.0, 3.0, 6.0]]], "float32")
    >>> y = np.asarray(LayerNorm()(x))
    >>> bool(abs(y.mean()) < 1e-6 and abs(y.std() - 1.0) < 1e-4)
    True

    References:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450)
    """

    def __init__(
        self,
        epsilon=1e-5,
        center=True,
        scale=True,
        axis=-1,
        beta_initializer="zeros",
        gamma_initializer="ones",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.epsilon = float(check_positive_number("epsilon", epsilon))
        self.center = bool(center)
        self.scale = bool(scale)
        self.axis = check_axis("axis", axis)
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.supports_masking = True

    def _axes(self, rank):
        """The normalized axes as sorted non-negative ints."""
        axes = self.axis if isinstance(self.axis, list) else [self.axis]
        normalized = []
        for a in axes:
            if a >= rank or a < -rank:
                raise ValueError(
                    f"`axis` is out of bounds for inputs of rank {rank}. Received: axis={self.axis}"
                )
            normalized.append(a % rank)
        return sorted(set(normalized))

    def build(self, input_shape):
        self._axes(len(input_shape))
        # Keras orders the weight dims by the sorted axis values as given
        # (e.g. [-1, 1] -> (D_last, D_1)); keep that so weights copy 1:1.
        raw = sorted(self.axis) if isinstance(self.axis, list) else [self.axis]
        shape = tuple(input_shape[a] for a in raw)
        if any(d is None for d in shape):
            raise ValueError(
                "LayerNorm needs known sizes on the normalized axes. Received: "
                f"input_shape={tuple(input_shape)}, axis={self.axis}"
            )
        self.gamma = self._add_param("gamma", shape, self.gamma_initializer) if self.scale else None
        self.beta = self._add_param("beta", shape, self.beta_initializer) if self.center else None

    def _add_param(self, name, shape, initializer):
        return self.add_weight(
            name=name, shape=shape, initializer=initializer, trainable=True, autocast=False
        )

    def _param(self, variable, input_shape, axes):
        value = ops.cast(variable, "float32")
        rank = len(input_shape)
        if axes == [rank - 1]:
            return value
        # Params over several or non-trailing axes broadcast from
        # [1, .., D, ..]; a plain reshape, exactly as Keras does.
        shape = [1] * rank
        for a in axes:
            shape[a] = input_shape[a]
        return ops.reshape(value, shape)

    def call(self, inputs):
        rank = len(inputs.shape)
        axes = self._axes(rank)
        x = ops.cast(inputs, "float32")
        mean = ops.mean(x, axis=axes, keepdims=True)
        centered = x - mean
        # centered * centered (MUL) rather than square: SQUARE has no int8 kernel.
        variance = ops.mean(centered * centered, axis=axes, keepdims=True)
        outputs = centered * ops.rsqrt(variance + self.epsilon)
        if self.gamma is not None:
            outputs = outputs * self._param(self.gamma, inputs.shape, axes)
        if self.beta is not None:
            outputs = outputs + self._param(self.beta, inputs.shape, axes)
        return ops.cast(outputs, self.compute_dtype)

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, input_shape):
        self._axes(len(input_shape))
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "epsilon": self.epsilon,
                "center": self.center,
                "scale": self.scale,
                "axis": self.axis,
                "beta_initializer": keras.initializers.serialize(self.beta_initializer),
                "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
            }
        )
        return config
