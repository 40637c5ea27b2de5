"""The loss, metric and learning-rate schedule that seq2seq training compiles with.

They live in `zoo`, not `train`, because a trained `model.keras` saves its
compile config, which names them: `import zoo` registers them, so
`keras.models.load_model(path)` works with default arguments in any process.
Their registered names are `train>...`, the names saved compile configs refer to.
Padding (id 0) never counts: the loss and the accuracy average over real target
tokens only.
"""

import keras
from keras import ops

from zoo.seq2seq.tokenization import PAD_ID


@keras.saving.register_keras_serializable(package="train")
class MaskedSmoothedCrossEntropy(keras.losses.Loss):
    """Label-smoothed cross-entropy on logits, averaged over non-padding tokens.

    With smoothing `e` over `V` classes the target is `(1 - e) * onehot + e / V`
    (as `keras.losses.CategoricalCrossentropy(label_smoothing=e)`).
    """

    def __init__(self, label_smoothing=0.1, name="masked_cross_entropy", **kwargs):
        kwargs.pop("reduction", None)  # in get_config(); fixed here (from_config round trip)
        super().__init__(name=name, reduction="sum", **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, PAD_ID), "float32")
        logp = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        nll = -ops.squeeze(ops.take_along_axis(logp, ops.expand_dims(y_true, -1), axis=-1), -1)
        smooth = -ops.mean(logp, axis=-1)
        e = self.label_smoothing
        loss = (1.0 - e) * nll + e * smooth
        return ops.sum(loss * mask) / ops.maximum(ops.sum(mask), 1.0)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="train")
class MaskedAccuracy(keras.metrics.Metric):
    """Next-token accuracy over non-padding target tokens."""

    def __init__(self, name="acc", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable((), initializer="zeros", name="correct")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, PAD_ID), "float32")
        hit = ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true), "float32")
        self.correct.assign_add(ops.sum(hit * mask))
        self.count.assign_add(ops.sum(mask))

    def result(self):
        return self.correct / ops.maximum(self.count, 1.0)


@keras.saving.register_keras_serializable(package="train")
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup_steps`, then `peak * sqrt(warmup / step)`
    (the Transformer schedule of Vaswani et al. with an explicit peak)."""

    def __init__(self, peak, warmup_steps):
        self.peak = float(peak)
        self.warmup_steps = int(max(1, warmup_steps))

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warm = float(self.warmup_steps)
        return self.peak * ops.minimum(step / warm, ops.sqrt(warm / step))

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}
