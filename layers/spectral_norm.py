"""Spectrally normalised convolution and dense layers (Miyato et al., 2018).

Why our own layers and not `keras.layers.SpectralNormalization`: in training,
Keras's wrapper computes `W / sigma` and *assigns* it back into the wrapped
layer's kernel, so the forward pass uses a variable and no gradient flows
through `sigma` (docs/facts.md). The paper, its Chainer code and TF-GAN
differentiate through `sigma(W)`; that extra term (`-(g . W_sn) u v^T / sigma`)
removes the gradient component that would only grow the top singular value.
Here the kernel variable stays the unnormalised `W`, every call divides it by
`sigma(W)` with `sigma` in the graph, and only the power-iteration vector `u`
is state.
"""

import keras
from keras import ops

from layers.validation import check_choice, check_int, check_pair, check_positive_number


def _l2_normalize(x, epsilon):
    return x * ops.rsqrt(ops.maximum(ops.sum(ops.square(x)), epsilon))


def spectral_normalize(kernel, u, epsilon=1e-12, power_iterations=1):
    """`kernel / sigma(kernel)` with sigma from power iteration started at `u`.

    Args:
        kernel: float tensor, any rank; the last axis is the output axis, the
            others are flattened (`W` is `[prod(shape[:-1]), shape[-1]]`).
        u: float tensor `[1, shape[-1]]`, the left singular vector estimate.
        epsilon: floor of the squared norm when normalising.
        power_iterations: number of power-iteration steps.

    Returns:
        `(normalized_kernel, new_u, sigma)`; `u` and `v` are constants for the
        gradient (as in the paper), `sigma` is differentiated through `kernel`.
    """
    w = ops.reshape(kernel, (-1, kernel.shape[-1]))
    u = ops.stop_gradient(u)
    for _ in range(power_iterations):
        v = _l2_normalize(ops.matmul(u, ops.transpose(w)), epsilon)
        u = _l2_normalize(ops.matmul(v, w), epsilon)
    v, u = ops.stop_gradient(v), ops.stop_gradient(u)
    sigma = ops.sum(ops.matmul(v, w) * u)
    return kernel / sigma, u, sigma


class _SpectralKernelMixin:
    """What `SNConv2D` and `SNDense` share: the options, the kernel, bias and
    `u`, the normalised kernel (`u` updated in training) and the bias add."""

    def _init_spectral(
        self, use_bias, kernel_initializer, bias_initializer, power_iterations, epsilon, seed
    ):
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.power_iterations = check_int("power_iterations", power_iterations)
        self.epsilon = float(check_positive_number("epsilon", epsilon))
        self.seed = seed

    def _build_weights(self, kernel_shape):
        """The kernel, the bias (when `use_bias`) and `u`; the last axis of
        `kernel_shape` is the output axis."""
        n_out = kernel_shape[-1]
        self.kernel = self.add_weight(
            name="kernel", shape=kernel_shape, initializer=self.kernel_initializer
        )
        self.bias = (
            self.add_weight(name="bias", shape=(n_out,), initializer=self.bias_initializer)
            if self.use_bias
            else None
        )
        # `u` is assigned in training, i.e. inside each replica under tf.distribute, so
        # it needs an aggregation (with the default "none" every replica silently keeps
        # its own copy). The new `u` is a function of the kernel and the old `u` only,
        # never of the data, and both are mirrored: every replica computes the same
        # value. "only_first_replica" keeps replica 0's (bit-identical copies on all
        # replicas, and no collective); "mean" would add an all-reduce per layer and
        # step and could round differently from one replica's value.
        self.u = self.add_weight(
            name="sn_u",
            shape=(1, n_out),
            initializer=keras.initializers.RandomNormal(stddev=1.0, seed=self.seed),
            trainable=False,
            autocast=False,
            aggregation="only_first_replica",
        )

    def _add_bias(self, outputs):
        if self.use_bias:
            outputs = outputs + ops.cast(self.bias, self.compute_dtype)
        return outputs

    def _spectral_config(self):
        return dict(
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            power_iterations=self.power_iterations,
            epsilon=self.epsilon,
            seed=self.seed,
        )

    def normalized_kernel(self, training=False):
        """The kernel divided by its spectral norm, in float32."""
        kernel = ops.cast(self.kernel, "float32")
        w_sn, u, _ = spectral_normalize(
            kernel, ops.cast(self.u, "float32"), self.epsilon, self.power_iterations
        )
        if training:
            self.u.assign(u)
        return w_sn

    def sigma(self):
        """The current spectral-norm estimate (no state change)."""
        kernel = ops.cast(self.kernel, "float32")
        return spectral_normalize(kernel, self.u, self.epsilon, self.power_iterations)[2]


@keras.saving.register_keras_serializable(package="layers")
class SNConv2D(_SpectralKernelMixin, keras.layers.Layer):
    """2-D convolution whose kernel is divided by its spectral norm.

    The kernel `W` (`[kh, kw, in, out]`, viewed as a `[kh*kw*in, out]` matrix)
    is used as `W / sigma(W)`, with `sigma` estimated by one power iteration
    per training step from a persistent vector `u` (Miyato et al., 2018).
    The gradient flows through `sigma` (see the module docstring for why this
    is not `keras.layers.SpectralNormalization`). At inference `u` is not
    updated, so repeated calls give the same output.

    Args:
        filters: number of output channels.
        kernel_size: int or pair of ints.
        strides: int or pair of ints. Defaults to 1.
        padding: `"same"` or `"valid"`. Defaults to `"same"`.
        use_bias: whether to add a bias. Defaults to `True`.
        kernel_initializer: initializer of `W`. Defaults to `"glorot_uniform"`.
        bias_initializer: initializer of the bias. Defaults to `"zeros"`.
        power_iterations: power-iteration steps per call. Defaults to 1.
        epsilon: floor of squared norms. Defaults to 1e-12.
        seed: seed of the random initial `u`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `[batch, height, width, channels]`.
        training: bool; `u` is updated only when `True`.

    Returns:
        `[batch, height', width', filters]` in the compute dtype.

    Example:

    >>> import numpy as np
    >>> layer = SNConv2D(4, 3)
    >>> tuple(layer(np.ones((1, 8, 8, 3), "float32")).shape)
    (1, 8, 8, 4)

    References:
        - [Miyato et al., 2018](https://arxiv.org/abs/1802.05957)
    """

    # keras.layers.Conv2D's signature (a mirror of Keras), plus the power iteration's options.
    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="same",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        power_iterations=1,
        epsilon=1e-12,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.filters = check_int("filters", filters)
        self.kernel_size = check_pair("kernel_size", kernel_size)
        self.strides = check_pair("strides", strides)
        self.padding = check_choice("padding", padding, ("same", "valid"))
        self._init_spectral(
            use_bias, kernel_initializer, bias_initializer, power_iterations, epsilon, seed
        )

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                "SNConv2D needs inputs [batch, height, width, channels] with known "
                f"channels. Received: input_shape={tuple(input_shape)}"
            )
        self._build_weights((*self.kernel_size, int(input_shape[-1]), self.filters))

    def call(self, inputs, training=False):
        kernel = ops.cast(self.normalized_kernel(training), self.compute_dtype)
        return self._add_bias(ops.conv(inputs, kernel, strides=self.strides, padding=self.padding))

    def compute_output_shape(self, input_shape):
        dims = []
        for size, k, s in zip(input_shape[1:3], self.kernel_size, self.strides):
            if size is None:
                dims.append(None)
            elif self.padding == "same":
                dims.append(-(-size // s))
            else:
                dims.append((size - k) // s + 1)
        return (input_shape[0], *dims, self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters,
            kernel_size=list(self.kernel_size),
            strides=list(self.strides),
            padding=self.padding,
            **self._spectral_config(),
        )
        return config


@keras.saving.register_keras_serializable(package="layers")
class SNDense(_SpectralKernelMixin, keras.layers.Layer):
    """Dense layer whose kernel is divided by its spectral norm.

    Same spectral normalisation as `SNConv2D` (one power iteration per
    training step, persistent `u`, gradient through `sigma`). Applied to
    one-hot class vectors it is a spectrally normalised embedding (the
    projection discriminator's class embedding).

    Args:
        units: output size.
        use_bias, kernel_initializer, bias_initializer, power_iterations,
            epsilon, seed: as `SNConv2D`'s (the same defaults).
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `[..., features]`.
        training: bool; `u` is updated only when `True`.

    Returns:
        `[..., units]` in the compute dtype.

    Example:

    >>> import numpy as np
    >>> tuple(SNDense(3)(np.ones((2, 5), "float32")).shape)
    (2, 3)

    References:
        - [Miyato et al., 2018](https://arxiv.org/abs/1802.05957)
    """

    # keras.layers.Dense's signature (a mirror of Keras), plus the power iteration's options.
    def __init__(
        self,
        units,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        power_iterations=1,
        epsilon=1e-12,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_int("units", units)
        self._init_spectral(
            use_bias, kernel_initializer, bias_initializer, power_iterations, epsilon, seed
        )
        self.supports_masking = True

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(
                f"SNDense needs a known last dimension. Received: input_shape={tuple(input_shape)}"
            )
        self._build_weights((int(input_shape[-1]), self.units))

    def call(self, inputs, training=False):
        kernel = ops.cast(self.normalized_kernel(training), self.compute_dtype)
        return self._add_bias(ops.matmul(inputs, kernel))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, **self._spectral_config())
        return config
