"""Class-conditional batch normalization (de Vries et al., 2017; SAGAN, BigGAN)."""

import keras
from keras import ops

from layers.validation import check_bool, check_int, check_positive_number, check_rate


@keras.saving.register_keras_serializable(package="layers")
class ConditionalBatchNormalization(keras.layers.Layer):
    """Batch normalization whose scale and shift are picked by a class label.

    `y = gamma[label] * (x - mean) / sqrt(var + epsilon) + beta[label]`, with
    `gamma` and `beta` tables of shape `[num_classes, C]` (initialised to ones
    and zeros). In training, `mean` and `var` are the batch statistics over
    batch, height and width, and the moving averages are updated; at
    inference the moving averages are used, so a sample's output does not
    depend on the rest of its batch and batch-1 generation (and export) works.
    (One public TF SAGAN always uses batch statistics; that breaks batch 1.)

    Under `tf.distribute`, each replica sees only its slice of the global
    batch. With `synchronized=True` the batch mean and variance are
    all-reduced across replicas (as `keras.layers.BatchNormalization`'s
    `synchronized`), so N replicas normalise exactly like one device with the
    whole batch, and the gradient flows through the all-reduce. The moving
    statistics are mirrored variables with MEAN aggregation: replicas stay
    identical either way.

    Statistics are computed in float32 under mixed precision. At inference
    the layer reduces to `x * scale + shift` with `[B, 1, 1, C]` factors:
    EQUAL, CAST, FULLY_CONNECTED, MUL and ADD, all GPU-delegate ops.

    Args:
        num_classes: number of classes (rows of the gamma / beta tables).
        momentum: moving-average momentum. Defaults to 0.99.
        epsilon: added to the variance. Defaults to 1e-5.
        gamma_initializer: initializer of the gamma table. Defaults to `"ones"`.
        beta_initializer: initializer of the beta table. Defaults to `"zeros"`.
        synchronized: all-reduce the training batch statistics across the
            replicas of a `tf.distribute` strategy (TensorFlow backend, in a
            replica context with more than one replica; elsewhere the local
            statistics are already the global ones). Defaults to `False`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `[B, ..., C]` (normalized over all axes but the last).
        labels: int tensor `[B]` (or `[B, 1]`) of class ids in `[0, num_classes)`.
        training: bool; batch statistics and moving-average updates when `True`.

    Returns:
        A tensor of the shape of `inputs`, in the compute dtype.

    Example:

    >>> import numpy as np
    >>> cbn = ConditionalBatchNormalization(num_classes=3)
    >>> x = np.random.default_rng(0).normal(size=(4, 2, 2, 5)).astype("float32")
    >>> y = cbn(x, np.array([0, 1, 2, 0], "int32"), training=True)
    >>> bool(abs(float(np.mean(y))) < 1e-5)
    True

    References:
        - [de Vries et al., 2017. Modulating early visual processing by
          language](https://arxiv.org/abs/1707.00683)
        - [Zhang et al., 2019. SAGAN](https://arxiv.org/abs/1805.08318)
    """

    def __init__(
        self,
        num_classes,
        momentum=0.99,
        epsilon=1e-5,
        gamma_initializer="ones",
        beta_initializer="zeros",
        synchronized=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_classes = check_int("num_classes", num_classes)
        self.momentum = check_rate("momentum", momentum)
        self.epsilon = float(check_positive_number("epsilon", epsilon))
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.synchronized = check_bool("synchronized", synchronized)

    def build(self, inputs_shape, labels_shape=None):
        channels = inputs_shape[-1]
        if channels is None or len(inputs_shape) < 2:
            raise ValueError(
                "ConditionalBatchNormalization needs inputs [batch, ..., channels] with "
                f"known channels. Received: inputs_shape={tuple(inputs_shape)}"
            )
        channels = int(channels)
        self.gamma = self.add_weight(
            name="gamma", shape=(self.num_classes, channels), initializer=self.gamma_initializer
        )
        self.beta = self.add_weight(
            name="beta", shape=(self.num_classes, channels), initializer=self.beta_initializer
        )
        # Assigned inside each replica under tf.distribute: without an aggregation every
        # replica would silently keep its own copy. MEAN keeps the copies identical (and,
        # with `synchronized`, every replica assigns the same value anyway).
        self.moving_mean = self._add_moving("moving_mean", channels, "zeros")
        self.moving_variance = self._add_moving("moving_variance", channels, "ones")

    def _add_moving(self, name, channels, initializer):
        return self.add_weight(
            name=name,
            shape=(channels,),
            initializer=initializer,
            trainable=False,
            autocast=False,
            aggregation="mean",
        )

    def call(self, inputs, labels, training=False):
        rank = len(inputs.shape)
        x = ops.cast(inputs, "float32")
        labels = ops.reshape(ops.cast(labels, "int32"), (-1,))
        factor_shape = (-1,) + (1,) * (rank - 2) + (x.shape[-1],)
        # One-hot rows (by comparison with the class ids) times the tables: `ops.take`
        # adds a negative-index int32 SELECT and `ops.one_hot` an int64 CAST, both
        # rejected by the mobile GPU delegate; EQUAL, CAST bool->float and a matmul are not.
        class_ids = ops.arange(self.num_classes, dtype="int32")
        onehot = ops.cast(ops.equal(ops.reshape(labels, (-1, 1)), class_ids[None, :]), "float32")
        gamma = ops.reshape(ops.matmul(onehot, ops.cast(self.gamma, "float32")), factor_shape)
        beta = ops.reshape(ops.matmul(onehot, ops.cast(self.beta, "float32")), factor_shape)
        if training:
            mean, variance = self._batch_moments(x)
            m = self.momentum
            self.moving_mean.assign(m * self.moving_mean + (1.0 - m) * mean)
            self.moving_variance.assign(m * self.moving_variance + (1.0 - m) * variance)
        else:
            mean, variance = self.moving_mean, self.moving_variance
        # (x * inv + (-mean * inv)): with the moving statistics the per-channel
        # factors are constants, and the map costs one MUL and one ADD.
        inv = ops.rsqrt(variance + self.epsilon)
        scale = gamma * inv
        shift = beta - gamma * (mean * inv)
        return ops.cast(x * scale + shift, self.compute_dtype)

    def _batch_moments(self, x):
        axes = list(range(len(x.shape) - 1))
        # Only the TensorFlow backend has replicas to synchronise (tf.distribute); with any
        # other backend, or outside `strategy.run`, the local statistics are the global ones.
        context = None
        if self.synchronized and keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync <= 1:
            mean = ops.mean(x, axis=axes)
            return mean, ops.mean(ops.square(x - mean), axis=axes)
        # Two passes, as on one device (not E[x^2] - E[x]^2, which cancels): the global
        # sum and count first, then the global sum of squared deviations from the mean.
        total = ops.concatenate(
            [
                ops.sum(x, axis=axes),
                ops.reshape(ops.cast(ops.size(x) // x.shape[-1], "float32"), (1,)),
            ]
        )
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, total)
        count = total[-1]
        mean = total[:-1] / count
        squares = context.all_reduce(
            tf.distribute.ReduceOp.SUM, ops.sum(ops.square(x - mean), axis=axes)
        )
        return mean, squares / count

    # Keras's compute_output_shape and get_config, every constructor argument (a mirror of Keras).
    def compute_output_shape(self, inputs_shape, labels_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_classes=self.num_classes,
            momentum=self.momentum,
            epsilon=self.epsilon,
            gamma_initializer=keras.initializers.serialize(self.gamma_initializer),
            beta_initializer=keras.initializers.serialize(self.beta_initializer),
            synchronized=self.synchronized,
        )
        return config
