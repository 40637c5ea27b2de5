"""TF Serving warm-up requests: `assets.extra/tf_serving_warmup_requests`.

A TFRecord file of `tensorflow.serving.PredictionLog` protos, built with
`tensorflow-serving-api`'s own messages (a declared dependency).
"""

import os

import numpy as np

WARMUP_PATH = os.path.join("assets.extra", "tf_serving_warmup_requests")


def _as_array(value):
    array = np.asarray(value)
    if array.dtype.kind == "U":
        array = np.char.encode(array, "utf-8").astype(object)
    return array


def write(export_dir, model_name, requests):
    """Writes `requests` [(signature_name, inputs: {name: array-like}), ...] into the
    warm-up file as predict requests for the served model `model_name`."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(export_dir, WARMUP_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for signature_name, inputs in requests:
            log = prediction_log_pb2.PredictionLog()
            request = log.predict_log.request
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature_name
            for k, v in sorted(inputs.items()):
                request.inputs[k].CopyFrom(tf.make_tensor_proto(_as_array(v)))
            writer.write(log.SerializeToString(deterministic=True))
