"""Small .tflite models, one per op family / shape situation that
export/check.py's GPU rules talk about; each is run on LiteRT's real GPU
accelerator by tests/export/test_check_calibration.py, and the static verdict must
equal the real one."""

import numpy as np


def _tf():
    import tensorflow as tf

    return tf


def convert(fn, specs, quantize=None):
    """`fn` (named TensorSpecs in, dict out) as a builtin-only .tflite (bytes)."""
    tf = _tf()
    module = tf.Module()
    module.f = tf.function(fn, input_signature=specs)
    concrete = module.f.get_concrete_function()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([concrete], module)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize == "softmax_beta":
        return with_softmax_beta(conv.convert(), 2.0)
    if quantize == "fp16+legalize":
        from export import gpu_rewrite

        return gpu_rewrite.legalize(convert(fn, specs, "fp16"))
    if quantize == "low_rank+legalize":
        from export import gpu_rewrite

        return gpu_rewrite.legalize(convert(fn, specs))
    if quantize == "fp16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    elif quantize == "int8":

        def data():
            rng = np.random.default_rng(0)
            for _ in range(16):
                yield [
                    rng.uniform(-1, 1, [int(d) for d in s.shape]).astype("float32") for s in specs
                ]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = data
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return conv.convert()


def with_softmax_beta(content, beta):
    """`content` with every SOFTMAX's beta set to `beta` (the converter folds no
    scale into beta, so the case is written into the flatbuffer)."""
    from export import flatbuffer

    model = flatbuffer.read_model(content)
    for sg in model.subgraphs:
        for op in sg.operators:
            if flatbuffer.op_name(model, op) == "SOFTMAX":
                op.builtinOptions.beta = beta
    return flatbuffer.write_model(model, len(content))


def _w(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-0.5, 0.5, shape).astype("float32")


def cases():
    """{name: (fn, specs, how)}: how is None, "fp16", "int8", "softmax_beta", or
    "fp16+legalize" / "low_rank+legalize" (converted, then export/gpu_rewrite.py)."""
    tf = _tf()
    f32 = tf.float32

    def spec(shape, dtype=f32, name="x"):
        return tf.TensorSpec(shape, dtype, name=name)

    W = _w(8, 4)
    out = {}
    out["dense_softmax"] = (
        lambda x: {"y": tf.nn.softmax(tf.nn.relu(tf.matmul(x, W)))},
        [spec([1, 8])],
        None,
    )
    out["dynamic_batch"] = (lambda x: {"y": tf.nn.relu(tf.matmul(x, W))}, [spec([None, 8])], None)
    out["dynamic_length"] = (
        lambda x: {"y": tf.reduce_mean(x, axis=1) * 2.0},
        [spec([1, None, 8])],
        None,
    )
    out["rank5"] = (
        lambda x: {"y": tf.reshape(tf.nn.relu(tf.reshape(x, [1, 2, 2, 2, 4]) + 1.0), [1, 32])},
        [spec([1, 32])],
        None,
    )
    table = _w(6, 4)
    out["gather_1d"] = (lambda i: {"y": tf.gather(table, i)}, [spec([5], tf.int32, "ids")], None)
    out["gather_2d_indices"] = (
        lambda i: {"y": tf.gather(table, i)},
        [spec([1, 5], tf.int32, "ids")],
        None,
    )
    out["arg_max"] = (
        lambda x: {"y": tf.argmax(x, axis=-1, output_type=tf.int32)},
        [spec([1, 4, 8])],
        None,
    )
    out["softmax_beta_2"] = (lambda x: {"y": tf.nn.softmax(x)}, [spec([1, 4, 8])], "softmax_beta")
    out["softmax"] = (lambda x: {"y": tf.nn.softmax(x)}, [spec([1, 4, 8])], None)
    out["strided_slice_4d"] = (lambda x: {"y": x[:, 1:3, :, ::2] * 2.0}, [spec([1, 4, 4, 8])], None)
    out["strided_slice_shrink"] = (lambda x: {"y": x[:, 0] * 2.0}, [spec([1, 4, 8])], None)
    out["strided_slice_2d"] = (lambda x: {"y": x[:, 2:6] * 2.0}, [spec([1, 8])], None)

    def while_loop(x):
        _, y = tf.while_loop(
            lambda i, y: i < 3, lambda i, y: (i + 1, y * 1.5 + 1.0), [tf.constant(0), x]
        )
        return {"y": y}

    out["while"] = (while_loop, [spec([1, 8])], None)
    out["int8_dense"] = (lambda x: {"y": tf.nn.relu(tf.matmul(x, W))}, [spec([1, 8])], "int8")
    b4 = _w(4, seed=1)
    out["fp16_dense_bias"] = (
        lambda x: {"y": tf.nn.relu(tf.matmul(x, W) + b4)},
        [spec([1, 8])],
        "fp16",
    )
    big = _w(64, 16, seed=2)
    out["fp16_gather"] = (
        lambda i: {"y": tf.gather(big, i) * 2.0},
        [spec([5], tf.int32, "ids")],
        "fp16",
    )
    out["fp16_gather_legalized"] = (
        lambda i: {"y": tf.gather(big, i) * 2.0},
        [spec([5], tf.int32, "ids")],
        "fp16+legalize",
    )
    out["fp16_dense"] = (lambda x: {"y": tf.nn.relu(tf.matmul(x, W))}, [spec([1, 8])], "fp16")
    K = _w(6, 9, 4)
    out["batch_matmul_broadcast_lhs"] = (lambda x: {"y": tf.matmul(x, K)}, [spec([1, 16, 9])], None)
    out["batch_matmul"] = (
        lambda a, b: {"y": tf.matmul(a, b)},
        [spec([1, 2, 8, 4], name="a"), spec([1, 2, 4, 8], name="b")],
        None,
    )
    P = _w(1, 16, 8)
    out["add_low_rank_runtime"] = (
        lambda x: {"y": tf.reshape(x, [16, 8]) * 0.5 + P},
        [spec([1, 128])],
        None,
    )
    out["add_low_rank_runtime_legalized"] = (
        lambda x: {"y": tf.reshape(x, [16, 8]) * 0.5 + P},
        [spec([1, 128])],
        "low_rank+legalize",
    )
    out["add_low_rank_const"] = (lambda x: {"y": x + _w(8)}, [spec([1, 16, 8])], None)
    out["expand_dims_as_reshape"] = (
        lambda x: {"y": tf.expand_dims(x, 1) * 2.0},
        [spec([1, 8])],
        None,
    )
    out["broadcast_to"] = (
        lambda x: {"y": tf.broadcast_to(x, [1, 4, 8]) * 2.0},
        [spec([1, 1, 8])],
        None,
    )
    out["cast_int_float"] = (
        lambda i: {"y": tf.cast(i, f32) * 0.5},
        [spec([1, 8], tf.int32, "ids")],
        None,
    )
    out["select_v2"] = (lambda x: {"y": tf.where(x > 0.0, x, x * 0.1)}, [spec([1, 4, 8])], None)
    out["layer_norm_mean"] = (
        lambda x: {
            "y": (x - tf.reduce_mean(x, -1, keepdims=True))
            * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-3)
        },
        [spec([1, 4, 8])],
        None,
    )
    out["transpose_concat"] = (
        lambda x: {"y": tf.concat([tf.transpose(x, [0, 2, 1, 3]), x], axis=3)},
        [spec([1, 4, 4, 8])],
        None,
    )

    def update(c, u, p):
        from keras import ops

        return {"y": ops.slice_update(c, tf.stack([0, p, 0, 0]), u) * 1.0}

    out["dynamic_update_slice"] = (
        update,
        [spec([1, 8, 2, 4], name="c"), spec([1, 1, 2, 4], name="u"), spec([], tf.int32, "p")],
        None,
    )
    out["shape_dependent_reshape"] = (
        lambda x: {"y": tf.reshape(x, tf.stack([tf.shape(x)[0], 2, 4])) * 2.0},
        [spec([None, 8])],
        None,
    )
    out["range_positions"] = (
        lambda x: {"y": x + tf.cast(tf.range(tf.shape(x)[1]), f32)[None, :, None]},
        [spec([1, None, 8])],
        None,
    )
    out["fill"] = (lambda x: {"y": x + tf.fill(tf.shape(x), 2.0)}, [spec([1, None, 8])], None)
    out["gather_nd"] = (
        lambda i: {"y": tf.gather_nd(table, i)},
        [spec([1, 5, 1], tf.int32, "ids")],
        None,
    )
    itable = np.arange(24, dtype="int32").reshape(6, 4)
    out["gather_int32_params"] = (
        lambda i: {"y": tf.gather(itable, i)},
        [spec([5], tf.int32, "ids")],
        None,
    )
    out["cast_float_int"] = (lambda x: {"y": tf.cast(x * 4.0, tf.int32)}, [spec([1, 8])], None)
    out["pad_2d"] = (lambda x: {"y": tf.pad(x, [[0, 0], [1, 1]]) * 2.0}, [spec([1, 8])], None)
    out["pad_4d"] = (
        lambda x: {"y": tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]) * 2.0},
        [spec([1, 4, 4, 8])],
        None,
    )
    out["mul_broadcast_both"] = (
        lambda a, b: {"y": a * b},
        [spec([1, 4, 1], name="a"), spec([1, 1, 4], name="b")],
        None,
    )
    out["conv2d"] = (
        lambda x: {"y": tf.nn.relu(tf.nn.conv2d(x, _w(3, 3, 4, 8), 1, "SAME"))},
        [spec([1, 8, 8, 4])],
        None,
    )
    return out
