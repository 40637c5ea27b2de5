"""The loss terms and batch helpers both compiled-model steps share (train.model_step's
tf.distribute step and train.jax_step's jitted step): a loss as (sum, count) over the
global batch, counted on the host, so every replica or device divides by the same
global count."""

import keras
import numpy as np
from keras import ops


def weighted_terms(loss):
    """(sum, count) from a Keras loss applied per element, weighted by sample weights
    (padding weight 0). Without weights every element counts."""
    if not isinstance(loss, keras.losses.Loss):
        loss = keras.losses.get(loss)
    per_element = loss.__class__.from_config({**loss.get_config(), "reduction": None})

    def terms(y, y_pred, sample_weight):
        values = ops.cast(per_element(y, y_pred), "float32")
        if sample_weight is None:
            return ops.sum(values), ops.cast(ops.size(values), "float32")
        w = ops.cast(sample_weight, "float32")
        return ops.sum(values * w), ops.sum(w)

    return terms


def masked_mean_terms(loss, pad_id=0):
    """(sum, count) for a loss that already averages over non-padding targets
    (e.g. seq2seq's MaskedSmoothedCrossEntropy): mean times the local count."""

    def terms(y, y_pred, sample_weight):
        count = ops.sum(ops.cast(ops.not_equal(y, pad_id), "float32"))
        return ops.cast(loss(y, y_pred), "float32") * count, count

    terms.kind = "masked"
    terms.pad_id = pad_id
    return terms


def host_count(y, w, terms):
    """The global normaliser of `terms`, computed on the host from the whole global batch
    (each worker holds it), so no collective is needed inside the compiled step."""
    if w is not None:
        return float(np.sum(np.asarray(w, np.float64)))
    if getattr(terms, "kind", None) == "masked":
        return float(np.sum(np.asarray(y) != terms.pad_id))
    return float(np.prod(np.shape(y)))
