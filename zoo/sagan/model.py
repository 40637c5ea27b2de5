"""Self-Attention GAN (Zhang et al., 2019): generator and projection discriminator.

`zoo.build("sagan_generator", image_size=32, num_classes=10, ...)` and
`zoo.build("sagan_discriminator", ...)` build functional Keras models:

- Generator: inputs `noise` float32 [B, latent_dim] (and `label` int32 [B] when
  class-conditional); output `image` float32 [B, S, S, channels] in [-1, 1]
  (tanh). A spectrally normalised linear projection makes a 4x4 map, residual
  up-blocks (conditional batch norm -> ReLU -> 2x nearest upsampling -> 3x3 conv,
  twice, with a 1x1-conv shortcut) double it to S x S, then BN -> ReLU -> 3x3
  conv -> tanh.
- Discriminator: inputs `image` (and `label`); output `logits` [B, 1]. Residual
  down-blocks (ReLU -> 3x3 conv, twice, 2x2 average pooling) to 4x4, a last
  block at 4x4, ReLU, global *sum* pooling, a linear output, and for
  class-conditional models the projection term `<embed(y), h>` (Miyato and
  Koyama, 2018) with a spectrally normalised embedding.
- `SelfAttention2D` after the block whose output has `attention_resolution`
  pixels per side, in both networks (default: the second-largest feature map,
  `image_size // 2`; `None` for the no-attention ablation).

Every conv and dense layer is spectrally normalised (SAGAN uses SN in G and D).
Channels at resolution r are `width * min(8, image_size // r)`.

The generator's batch norms are synchronised across the replicas of a
`tf.distribute` strategy (`synchronized=True`; the statistics of the whole global
batch), so training on N replicas computes what one device computes.
"""

import math

import keras
from keras import ops

from layers import ConditionalBatchNormalization, SelfAttention2D, SNConv2D, SNDense
from layers.validation import check_bool, check_int

ATTENTION_LAYER = "self_attention"


def resolve_attention(image_size, attention_resolution):
    """The attention resolution as an int, or None; ValueError if impossible."""
    if attention_resolution == "auto":
        return image_size // 2
    if attention_resolution in (None, 0, False):
        return None
    allowed = [2**k for k in range(3, int(math.log2(image_size)))]
    if attention_resolution not in allowed:
        raise ValueError(
            f"`attention_resolution` must be one of {allowed} (a feature-map size of both "
            f"networks), 'auto' or None. Received: attention_resolution={attention_resolution!r}"
        )
    return int(attention_resolution)


def channels_at(width, image_size, resolution):
    return width * min(8, image_size // resolution)


def _validate(image_size, channels, num_classes, width, latent_dim):
    if (
        isinstance(image_size, bool)
        or not isinstance(image_size, int)
        or image_size < 32
        or image_size & (image_size - 1)
    ):
        raise ValueError(
            "`image_size` must be a power of two >= 32 (the generator doubles a 4x4 map "
            f"until it reaches the image size). Received: image_size={image_size!r}"
        )
    for name, value in (("channels", channels), ("width", width), ("latent_dim", latent_dim)):
        check_int(name, value)
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2
    ):
        raise ValueError(
            f"`num_classes` must be None (unconditional) or an integer >= 2. "
            f"Received: num_classes={num_classes!r}"
        )


@ops.custom_gradient
def upsample_nearest_2x(x):
    """2x nearest-neighbour upsampling of [B, H, W, C] (static H, W, C).

    Forward: one RESIZE_NEAREST_NEIGHBOR (keras.layers.UpSampling2D repeats through a
    5-D TILE, which the mobile GPU delegate rejects). Backward: each input pixel's
    gradient is the sum over its 2x2 output block, written as a reshape and a sum
    because TensorFlow's own gradient (ResizeNearestNeighborGrad) has no XLA kernel
    outside TPUs, which kept G's training step from compiling.
    """
    _, h, w, c = x.shape
    y = ops.image.resize(x, (2 * h, 2 * w), interpolation="nearest")

    def grad(*args, upstream=None):
        dy = args[0] if upstream is None else upstream
        return ops.sum(ops.reshape(dy, (-1, h, 2, w, 2, c)), axis=(2, 4))

    return y, grad


@keras.saving.register_keras_serializable(package="zoo")
class GeneratorBlock(keras.layers.Layer):
    """SAGAN/BigGAN residual up-block with (conditional) batch norm.

    Args:
        filters: output channels.
        num_classes: classes of the conditional batch norm; None: plain BN.
        momentum: batch-norm momentum.
        seed: seed of the spectral-norm vectors.
        synchronized: batch statistics over all replicas under `tf.distribute`
            (see `ConditionalBatchNormalization`). Defaults to `True`.

    Call arguments:
        inputs: [B, H, W, C_in]; labels: int32 [B] (conditional only).

    Returns:
        [B, 2H, 2W, filters].
    """

    def __init__(
        self, filters, num_classes=None, momentum=0.9, seed=None, synchronized=True, **kwargs
    ):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.num_classes = num_classes
        self.momentum = float(momentum)
        self.seed = seed
        self.synchronized = check_bool("synchronized", synchronized)
        self.bn1 = self._norm("bn1")
        self.bn2 = self._norm("bn2")
        self.conv1 = SNConv2D(self.filters, 3, seed=seed, name="conv1", dtype=self.dtype_policy)
        self.conv2 = SNConv2D(self.filters, 3, seed=seed, name="conv2", dtype=self.dtype_policy)
        self.shortcut = SNConv2D(
            self.filters, 1, seed=seed, name="shortcut", dtype=self.dtype_policy
        )

    def _norm(self, name):
        if self.num_classes:
            return ConditionalBatchNormalization(
                self.num_classes,
                momentum=self.momentum,
                name=name,
                synchronized=self.synchronized,
                dtype=self.dtype_policy,
            )
        return keras.layers.BatchNormalization(
            momentum=self.momentum,
            epsilon=1e-5,
            name=name,
            synchronized=_keras_bn_synchronized(self.synchronized),
            dtype=self.dtype_policy,
        )

    def _bn(self, bn, x, labels, training):
        if self.num_classes:
            return bn(x, labels, training=training)
        return bn(x, training=training)

    def build(self, inputs_shape, labels_shape=None):
        out = self.compute_output_shape(inputs_shape)
        up = (*out[:3], inputs_shape[-1])  # the input upsampled
        labels = [(out[0],)] if self.num_classes else []
        self.bn1.build(inputs_shape, *labels)
        self.bn2.build(out, *labels)
        self.conv1.build(up)
        self.conv2.build(out)
        self.shortcut.build(up)

    def call(self, inputs, labels=None, training=None):
        h = ops.relu(self._bn(self.bn1, inputs, labels, training))
        h = self.conv1(upsample_nearest_2x(h), training=training)
        h = ops.relu(self._bn(self.bn2, h, labels, training))
        h = self.conv2(h, training=training)
        return h + self.shortcut(upsample_nearest_2x(inputs), training=training)

    def compute_output_shape(self, inputs_shape, labels_shape=None):
        b, h, w, _ = inputs_shape
        return (b, None if h is None else 2 * h, None if w is None else 2 * w, self.filters)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "num_classes": self.num_classes,
            "momentum": self.momentum,
            "seed": self.seed,
            "synchronized": self.synchronized,
        }


def _keras_bn_synchronized(synchronized):
    # keras.layers.BatchNormalization refuses synchronized=True on other backends (it is
    # a tf.distribute feature); elsewhere there are no replicas to synchronise.
    return bool(synchronized) and keras.backend.backend() == "tensorflow"


@keras.saving.register_keras_serializable(package="zoo")
class DiscriminatorBlock(keras.layers.Layer):
    """SN-GAN/SAGAN residual down-block (pre-activation, average pooling).

    Args:
        filters: output channels.
        downsample: halve the resolution with 2x2 average pooling.
        first: the "optimized" first block (no ReLU before the first conv,
            pooling before the shortcut conv), as in SN-GAN.
        seed: seed of the spectral-norm vectors.
    """

    def __init__(self, filters, downsample=True, first=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.downsample = bool(downsample)
        self.first = bool(first)
        self.seed = seed
        self.conv1 = SNConv2D(self.filters, 3, seed=seed, name="conv1", dtype=self.dtype_policy)
        self.conv2 = SNConv2D(self.filters, 3, seed=seed, name="conv2", dtype=self.dtype_policy)
        self.shortcut = SNConv2D(
            self.filters, 1, seed=seed, name="shortcut", dtype=self.dtype_policy
        )
        self.pool = keras.layers.AveragePooling2D(2, name="pool", dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.conv1.build(inputs_shape)
        self.conv2.build((*inputs_shape[:3], self.filters))
        self.shortcut.build(inputs_shape)

    def _pool(self, x):
        return self.pool(x) if self.downsample else x

    def call(self, inputs, training=None):
        h = inputs if self.first else ops.relu(inputs)
        h = self.conv1(h, training=training)
        h = self.conv2(ops.relu(h), training=training)
        h = self._pool(h)
        if self.first:
            shortcut = self.shortcut(self._pool(inputs), training=training)
        else:
            shortcut = self._pool(self.shortcut(inputs, training=training))
        return h + shortcut

    def compute_output_shape(self, inputs_shape):
        b, h, w, _ = inputs_shape
        if self.downsample:
            h = None if h is None else h // 2
            w = None if w is None else w // 2
        return (b, h, w, self.filters)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "downsample": self.downsample,
            "first": self.first,
            "seed": self.seed,
        }


@keras.saving.register_keras_serializable(package="zoo")
class ProjectionHead(keras.layers.Layer):
    """ReLU, global sum pooling, linear output plus `<embed(y), h>` (projection D).

    Args:
        num_classes: classes of the projection embedding; None: no projection.
        seed: seed of the spectral-norm vectors.

    Call arguments:
        inputs: [B, H, W, C]; labels: int32 [B] (conditional only).

    Returns:
        logits [B, 1].
    """

    def __init__(self, num_classes=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.seed = seed
        self.linear = SNDense(1, seed=seed, name="linear", dtype=self.dtype_policy)
        self.embed = None

    def build(self, inputs_shape, labels_shape=None):
        channels = int(inputs_shape[-1])
        self.linear.build((inputs_shape[0], channels))
        if self.num_classes:
            # An SN dense layer on one-hot labels is an SN embedding table.
            self.embed = SNDense(
                channels, use_bias=False, seed=self.seed, name="embed", dtype=self.dtype_policy
            )
            self.embed.build((inputs_shape[0], self.num_classes))

    def call(self, inputs, labels=None, training=None):
        h = ops.sum(ops.relu(inputs), axis=(1, 2))
        out = self.linear(h, training=training)
        if self.num_classes:
            onehot = ops.one_hot(
                ops.reshape(ops.cast(labels, "int32"), (-1,)), self.num_classes, dtype=h.dtype
            )
            out = out + ops.sum(self.embed(onehot, training=training) * h, axis=-1, keepdims=True)
        return out

    def class_scores(self, inputs):
        """`<embed(k), h>` for every class k: [B, num_classes] (float32).

        The projection term of each class, for all classes at once; their softmax is
        the discriminator's own class posterior (the unconditional term is the same for
        every class and cancels). Training adds a cross-entropy on these scores
        (`train/sagan/fit.py`, dual projection). No state change.
        """
        h = ops.sum(ops.relu(ops.cast(inputs, "float32")), axis=(1, 2))
        return ops.matmul(h, ops.transpose(self.embed.normalized_kernel(training=False)))

    def compute_output_shape(self, inputs_shape, labels_shape=None):
        return (inputs_shape[0], 1)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "seed": self.seed}


@keras.saving.register_keras_serializable(package="zoo")
class ClassEmbedding(keras.layers.Layer):
    """A learned embedding of class ids, `table[label]`, as a one-hot matmul.

    The generator concatenates it to the noise, so the label moves every channel
    of the first feature map from the first step (cGAN input conditioning); the
    conditional batch norms alone move it only through per-class gains that Adam
    changes by about one learning rate per step. The lookup is EQUAL, CAST and
    FULLY_CONNECTED (GPU-delegate ops), as in `ConditionalBatchNormalization`.

    Args:
        num_classes: number of classes.
        dim: embedding size.

    Call arguments:
        labels: int32 [B] (or [B, 1]).

    Returns:
        float [B, dim].
    """

    def __init__(self, num_classes, dim, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = int(num_classes)
        self.dim = int(dim)

    def build(self, labels_shape):
        self.table = self.add_weight(
            name="table",
            shape=(self.num_classes, self.dim),
            initializer=keras.initializers.RandomNormal(stddev=1.0),
        )

    def call(self, labels):
        labels = ops.reshape(ops.cast(labels, "int32"), (-1, 1))
        class_ids = ops.arange(self.num_classes, dtype="int32")
        onehot = ops.cast(ops.equal(labels, class_ids[None, :]), self.compute_dtype)
        return ops.matmul(onehot, ops.cast(self.table, self.compute_dtype))

    def compute_output_shape(self, labels_shape):
        return (labels_shape[0], self.dim)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "dim": self.dim}


def build_generator(
    image_size=32,
    channels=3,
    num_classes=None,
    latent_dim=128,
    width=32,
    attention_resolution="auto",
    seed=None,
    class_embedding=0,
):
    """SAGAN generator (see the module docstring).

    Args:
        image_size: output side, a power of two >= 32.
        channels: image channels (3 RGB, 1 grey).
        num_classes: None for unconditional, else the number of classes (CBN).
        latent_dim: noise size.
        width: base channel count (channels at resolution r: width * min(8, size // r)).
        attention_resolution: feature-map side after which `SelfAttention2D`
            runs; "auto" = image_size // 2 (the second-largest map), None = none.
        seed: seed of the spectral-norm vectors.
        class_embedding: size of a learned class embedding concatenated to the
            noise (conditional models only; 0 = none, the label acts through the
            conditional batch norms alone).

    Returns:
        A functional `keras.Model` named "sagan_generator".
    """
    _validate(image_size, channels, num_classes, width, latent_dim)
    check_int("class_embedding", class_embedding, minimum=0)
    attention = resolve_attention(image_size, attention_resolution)
    noise = keras.Input((latent_dim,), name="noise")
    label = keras.Input((), dtype="int32", name="label") if num_classes else None
    c0 = channels_at(width, image_size, 4)
    # The dense projection as a 1x1 conv on a 1x1 map (the same matrix, also for the
    # spectral norm): with fp16 weights, TFLite's FULLY_CONNECTED gets its weights and
    # bias through DEQUANTIZE ops, which the GPU check counts as runtime inputs.
    x = noise
    if num_classes and class_embedding:
        embedded = ClassEmbedding(num_classes, class_embedding, name="class_embedding")(label)
        x = keras.layers.Concatenate(name="noise_and_class")([noise, embedded])
    x = keras.layers.Reshape((1, 1, int(x.shape[-1])), name="noise_map")(x)
    x = SNConv2D(4 * 4 * c0, 1, seed=seed, name="project")(x)
    x = keras.layers.Reshape((4, 4, c0), name="to_map")(x)
    resolution = 4
    while resolution < image_size:
        resolution *= 2
        block = GeneratorBlock(
            channels_at(width, image_size, resolution),
            num_classes,
            seed=seed,
            name=f"up_{resolution}",
        )
        x = block(x, label) if num_classes else block(x)
        if resolution == attention:
            x = SelfAttention2D(seed=seed, name=ATTENTION_LAYER)(x)
    x = keras.layers.BatchNormalization(
        momentum=0.9, epsilon=1e-5, name="bn_out", synchronized=_keras_bn_synchronized(True)
    )(x)
    x = keras.layers.ReLU(name="relu_out")(x)
    x = SNConv2D(channels, 3, seed=seed, name="to_rgb")(x)
    image = keras.layers.Activation("tanh", name="image", dtype="float32")(x)
    inputs = {"noise": noise, "label": label} if num_classes else {"noise": noise}
    return keras.Model(inputs, image, name="sagan_generator")


def build_discriminator(
    image_size=32, channels=3, num_classes=None, width=32, attention_resolution="auto", seed=None
):
    """SAGAN projection discriminator (see the module docstring).

    Args: as `build_generator` (without `latent_dim`).

    Returns:
        A functional `keras.Model` named "sagan_discriminator": `image` (and
        `label`) in, `logits` [B, 1] out.
    """
    _validate(image_size, channels, num_classes, width, 1)
    attention = resolve_attention(image_size, attention_resolution)
    image = keras.Input((image_size, image_size, channels), name="image")
    label = keras.Input((), dtype="int32", name="label") if num_classes else None
    x = image
    resolution = image_size
    while resolution > 4:
        resolution //= 2
        x = DiscriminatorBlock(
            channels_at(width, image_size, resolution),
            first=resolution == image_size // 2,
            seed=seed,
            name=f"down_{resolution}",
        )(x)
        if resolution == attention:
            x = SelfAttention2D(seed=seed, name=ATTENTION_LAYER)(x)
    x = DiscriminatorBlock(
        channels_at(width, image_size, 4), downsample=False, seed=seed, name="block_4"
    )(x)
    head = ProjectionHead(num_classes, seed=seed, name="logits")
    logits = head(x, label) if num_classes else head(x)
    inputs = {"image": image, "label": label} if num_classes else {"image": image}
    return keras.Model(inputs, logits, name="sagan_discriminator")


class _AttentionScores(keras.layers.Layer):
    """The attention weights of `attention` as a layer of their own: a Keras functional
    model takes a layer's outputs by its first call, which returned only the features."""

    def __init__(self, attention, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention

    def call(self, inputs):
        return self.attention(inputs, return_attention_scores=True, training=False)[1]


def attention_scores(generator, inputs):
    """(images, attention scores [B, H*W, keys], side) of `generator` on `inputs`.

    Returns None when the generator has no attention layer. The scores are
    those of the generator's `SelfAttention2D` (inference mode); `side` is
    the feature-map side the attention runs at (queries and keys row-major,
    keys on the 2x2-pooled map).
    """
    try:
        layer = generator.get_layer(ATTENTION_LAYER)
    except ValueError:
        return None
    probe = keras.Model(generator.input, [generator.output, _AttentionScores(layer)(layer.input)])
    # JAX compiles each op of an eager call on its own (87 programs here); one jitted
    # predict is one program. TensorFlow runs eager ops without compiling, faster than
    # tracing a tf.function for one batch.
    if keras.backend.backend() == "jax":
        images, scores = probe.predict_on_batch(inputs)
    else:
        images, scores = probe(inputs, training=False)
    return images, scores, int(layer.input.shape[1])
