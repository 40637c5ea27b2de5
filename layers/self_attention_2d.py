"""The SAGAN self-attention block on 2-D feature maps."""

import keras
from keras import ops

from layers.scores_output_spec import ScoresOutputSpec
from layers.spectral_norm import SNConv2D
from layers.validation import check_int


@keras.saving.register_keras_serializable(package="layers")
class SelfAttention2D(ScoresOutputSpec, keras.layers.Layer):
    """Self-attention over the positions of a feature map (SAGAN).

    For `x` of shape `[B, H, W, C]`: query `f(x)` (1x1 conv to `C / key_ratio`),
    key `g(x)` (1x1 conv to `C / key_ratio`) and value `h(x)` (1x1 conv to
    `C / value_ratio`); keys and values are 2x2 max-pooled (`pool=True`, as in
    the official code: `N / 4` keys). Each position attends over the keys,
    `beta = softmax(f g^T)` (no scaling, as in the paper), `o = v(beta h)`
    with `v` a 1x1 conv back to `C`, and `y = x + gamma * o` with `gamma` a
    learned scalar initialised to 0, so the block starts as the identity and
    the network learns how much non-local evidence to use. All four convs are
    spectrally normalised (`SNConv2D`) and have no bias.

    The map is flattened to a sequence of `H * W` positions before the matrix
    products, so no tensor exceeds rank 4 (the mobile GPU delegate's limit;
    `keras.layers.MultiHeadAttention(attention_axes=(1, 2))` makes 5-D ones).

    Args:
        key_ratio: channels of queries and keys are `C // key_ratio`.
            Defaults to 8.
        value_ratio: channels of values are `C // value_ratio`. Defaults to 2.
        pool: max-pool keys and values 2x2 (stride 2). Defaults to `True`.
        spectral_norm: spectrally normalise the convs. Defaults to `True`.
        kernel_initializer: initializer of the conv kernels. Defaults to
            `"orthogonal"` (the official code's).
        gamma_initializer: initializer of `gamma`. Defaults to `"zeros"`.
        seed: seed of the power-iteration vectors.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `[B, H, W, C]`.
        return_attention_scores: also return the attention weights
            `[B, H * W, keys]` (`keys = (H // 2) * (W // 2)` with `pool`),
            query positions and keys both in row-major order.
        training: bool, updates the spectral-norm vectors when `True`.

    Returns:
        `y` `[B, H, W, C]`, or `(y, scores)`.

    Example:

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(2, 8, 8, 16)).astype("float32")
    >>> y, scores = SelfAttention2D()(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((2, 8, 8, 16), (2, 64, 16))
    >>> bool(np.allclose(y, x))  # gamma starts at 0
    True

    References:
        - [Zhang et al., 2019. Self-Attention Generative Adversarial
          Networks](https://arxiv.org/abs/1805.08318)
    """

    def __init__(
        self,
        key_ratio=8,
        value_ratio=2,
        pool=True,
        spectral_norm=True,
        kernel_initializer="orthogonal",
        gamma_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.key_ratio = check_int("key_ratio", key_ratio)
        self.value_ratio = check_int("value_ratio", value_ratio)
        self.pool = bool(pool)
        self.spectral_norm = bool(spectral_norm)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.seed = seed

    def _conv(self, filters, name):
        kwargs = dict(
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            name=name,
            dtype=self.dtype_policy,
        )
        if self.spectral_norm:
            return SNConv2D(filters, 1, seed=self.seed, **kwargs)
        return keras.layers.Conv2D(filters, 1, **kwargs)

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                "SelfAttention2D needs inputs [batch, height, width, channels] with "
                f"known channels. Received: input_shape={tuple(input_shape)}"
            )
        channels = int(input_shape[-1])
        for name, ratio in (("key_ratio", self.key_ratio), ("value_ratio", self.value_ratio)):
            if channels // ratio < 1:
                raise ValueError(
                    f"`{name}` leaves no channels for {channels} input channels. "
                    f"Received: {name}={ratio}"
                )
        self.query_conv = self._conv(channels // self.key_ratio, "query")
        self.key_conv = self._conv(channels // self.key_ratio, "key")
        self.value_conv = self._conv(channels // self.value_ratio, "value")
        self.output_conv = self._conv(channels, "attention_output")
        shape = tuple(input_shape)
        for conv in (self.query_conv, self.key_conv, self.value_conv):
            conv.build(shape)
        self.output_conv.build((*shape[:3], channels // self.value_ratio))
        self.gamma = self.add_weight(name="gamma", shape=(), initializer=self.gamma_initializer)

    def _flatten(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (-1, shape[1] * shape[2], x.shape[-1]))

    def call(self, inputs, return_attention_scores=False, training=None):
        shape = ops.shape(inputs)
        height, width = shape[1], shape[2]
        conv_kwargs = {"training": training} if self.spectral_norm else {}
        query = self.query_conv(inputs, **conv_kwargs)
        key = self.key_conv(inputs, **conv_kwargs)
        value = self.value_conv(inputs, **conv_kwargs)
        if self.pool:
            key = ops.max_pool(key, 2, 2, padding="valid")
            value = ops.max_pool(value, 2, 2, padding="valid")
        query = self._flatten(query)
        key = self._flatten(key)
        value = self._flatten(value)
        logits = ops.matmul(query, ops.transpose(key, (0, 2, 1)))
        # Softmax in float32: fp16 logits of long sequences overflow exp.
        scores = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), self.compute_dtype)
        attended = ops.matmul(scores, value)
        attended = ops.reshape(attended, (-1, height, width, value.shape[-1]))
        output = self.output_conv(attended, **conv_kwargs)
        outputs = inputs + ops.cast(self.gamma, self.compute_dtype) * output
        if return_attention_scores:
            return outputs, scores
        return outputs

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, inputs_shape, return_attention_scores=False):
        input_shape = tuple(inputs_shape)
        if not return_attention_scores:
            return input_shape
        batch, height, width = input_shape[:3]
        if height is None or width is None:
            return input_shape, (batch, None, None)
        keys = (height // 2) * (width // 2) if self.pool else height * width
        return input_shape, (batch, height * width, keys)

    def get_config(self):
        config = super().get_config()
        config.update(
            key_ratio=self.key_ratio,
            value_ratio=self.value_ratio,
            pool=self.pool,
            spectral_norm=self.spectral_norm,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            gamma_initializer=keras.initializers.serialize(self.gamma_initializer),
            seed=self.seed,
        )
        return config
