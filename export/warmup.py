"""TF Serving warm-up requests: `assets.extra/tf_serving_warmup_requests`.

A TFRecord file of `tensorflow.serving.PredictionLog` protos. The official
`tensorflow-serving-api` messages are used when installed (a declared
dependency; an environment may still lack it, e.g. one built on
`tensorflow-cpu`, which the API's own dependency on `tensorflow` clashes
with). Without it, the same messages are
built from a descriptor that declares only the fields we write, with the same
field numbers and wire types (a proto map is, on the wire, a repeated
key/value message; a nested message is length-delimited bytes), so the
records are byte-for-byte what the official classes produce.
"""

import os

import numpy as np

WARMUP_PATH = os.path.join("assets.extra", "tf_serving_warmup_requests")


def _subset_class():
    """PredictionLog built from a descriptor of only the fields written here."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="attention_zoo/prediction_log_subset.proto",
        package="tensorflow.serving",
        syntax="proto3",
    )

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message(
        "ModelSpec",
        [("name", 1, F.TYPE_STRING, opt, None), ("signature_name", 3, F.TYPE_STRING, opt, None)],
    )
    message(
        "InputsEntry", [("key", 1, F.TYPE_STRING, opt, None), ("value", 2, F.TYPE_BYTES, opt, None)]
    )  # TensorProto bytes
    message(
        "PredictRequest",
        [
            ("model_spec", 1, F.TYPE_MESSAGE, opt, ".tensorflow.serving.ModelSpec"),
            ("inputs", 2, F.TYPE_MESSAGE, rep, ".tensorflow.serving.InputsEntry"),
        ],
    )
    message(
        "PredictLog", [("request", 1, F.TYPE_MESSAGE, opt, ".tensorflow.serving.PredictRequest")]
    )
    message(
        "PredictionLog", [("predict_log", 6, F.TYPE_MESSAGE, opt, ".tensorflow.serving.PredictLog")]
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.PredictionLog")
    )


def prediction_log_bytes(model_name, signature_name, inputs, official=True):
    """One serialized PredictionLog for a predict request.

    Args:
        model_name: the served model's name.
        signature_name: signature key.
        inputs: dict input name -> array-like (one batch).
        official: use tensorflow-serving-api's classes when installed.
    """
    import tensorflow as tf

    tensors = {k: tf.make_tensor_proto(_as_array(v)) for k, v in sorted(inputs.items())}
    try:
        from tensorflow_serving.apis import prediction_log_pb2
    except ImportError:
        official = False
    log = prediction_log_pb2.PredictionLog() if official else _subset_class()()
    request = log.predict_log.request
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    for k, t in tensors.items():
        if official:
            request.inputs[k].CopyFrom(t)
        else:
            request.inputs.add(key=k, value=t.SerializeToString(deterministic=True))
    return log.SerializeToString(deterministic=True)


def _as_array(value):
    array = np.asarray(value)
    if array.dtype.kind == "U":
        array = np.char.encode(array, "utf-8").astype(object)
    return array


def write(export_dir, model_name, requests):
    """Writes `requests` [(signature_name, inputs), ...] into the warm-up file."""
    import tensorflow as tf

    path = os.path.join(export_dir, WARMUP_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for signature_name, inputs in requests:
            writer.write(prediction_log_bytes(model_name, signature_name, inputs))
    return path
