"""`python -m export check`: our GPU / int8 delegate rules on hand-built TFLite models.

Each model is built from plain TF ops (no project code), so what is in the
flatbuffer is known from the graph; the expectations follow what LiteRT's real
GPU accelerator does with such models (tests/export/test_check_calibration.py runs them
there).
"""

import numpy as np
import pytest
import tensorflow as tf

from export.__main__ import main
from export.check import check_model, op_counts
from tests.support import gpu_calibration_models


def _convert(fn, specs, flex=False, int8_data=None):
    concrete = tf.function(fn, input_signature=specs).get_concrete_function()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS] + (
        [tf.lite.OpsSet.SELECT_TF_OPS] if flex else []
    )
    if int8_data is not None:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([x] for x in int8_data)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return conv.convert()


TABLE = np.random.default_rng(0).standard_normal((10, 4)).astype("float32")
W = np.random.default_rng(1).standard_normal((4, 3)).astype("float32")


def _clean(ids):
    # 1-D int32 gather, matmul, softmax: everything static and on the allowlist.
    x = tf.gather(tf.constant(TABLE), ids)
    return tf.nn.softmax(tf.matmul(x, tf.constant(W)))


def _reasons(content, target="gpu"):
    return [f"{p.op}: {p.reason}" for p in check_model(content, target)]


def test_clean_static_model_passes():
    content = _convert(_clean, [tf.TensorSpec([5], tf.int32, name="ids")])
    assert "GATHER" in op_counts(content)
    assert _reasons(content) == []


def test_a_model_without_operators_fails():
    """Fail closed: nothing checked is not "compatible"."""
    content = _convert(lambda x: x, [tf.TensorSpec([4], tf.float32)])
    assert op_counts(content) == {}
    for target in ("gpu", "int8"):
        assert _reasons(content, target) == ["-: the model has no operators: nothing was checked"]


def test_five_d_tensor_fails():
    content = _convert(
        lambda x: tf.nn.relu(x * 2.0 + 1.0), [tf.TensorSpec([1, 2, 3, 4, 5], tf.float32)]
    )
    reasons = _reasons(content)
    assert reasons and all("5-D tensor" in r for r in reasons)


def test_dynamic_dimension_alone_is_gpu_clean_but_not_int8():
    """LiteRT's GPU accelerator resizes a model whose -1 dimensions need no
    dynamic-shape op (tests/export/test_check_calibration.py: dynamic_batch,
    dynamic_length); integer-only accelerators need static shapes."""
    content = _convert(_clean, [tf.TensorSpec([None], tf.int32, name="ids")])
    assert _reasons(content) == []
    assert any("dynamic" in r for r in _reasons(content, "int8"))


def test_patterns_the_gpu_accelerator_computes_wrong_fail_until_rewritten():
    """A batch-broadcast BATCH_MATMUL and a low-rank runtime elementwise operand
    pass the op allowlist and compile, then compute wrong numbers on the GPU
    accelerator (calibration cases); check names them, and gpu_rewrite.legalize
    fixes the second with bitwise-equal CPU results."""
    from ai_edge_litert.interpreter import Interpreter

    from export import gpu_rewrite

    k = np.random.default_rng(2).standard_normal((6, 9, 4)).astype("float32")
    bmm = _convert(lambda x: tf.matmul(x, tf.constant(k)), [tf.TensorSpec([1, 16, 9], tf.float32)])
    assert any(
        r.startswith("BATCH_MATMUL") and "broadcasts its first operand" in r for r in _reasons(bmm)
    )
    p = np.random.default_rng(3).standard_normal((1, 16, 8)).astype("float32")
    low = _convert(
        lambda x: tf.reshape(x, [16, 8]) * 0.5 + tf.constant(p),
        [tf.TensorSpec([1, 128], tf.float32)],
    )
    assert any(r.startswith("ADD") and "lower rank" in r for r in _reasons(low))
    fixed = gpu_rewrite.legalize(low)
    assert _reasons(fixed) == [] and "RESHAPE" in op_counts(fixed)
    x = np.random.default_rng(4).standard_normal((1, 128)).astype("float32")

    def run(content):
        interp = Interpreter(model_content=content)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        return interp.get_tensor(interp.get_output_details()[0]["index"])

    np.testing.assert_array_equal(run(low), run(fixed))


def test_flex_op_fails():
    content = _convert(
        lambda x: tf.bitwise.bitwise_and(x, 3), [tf.TensorSpec([4], tf.int32)], flex=True
    )
    assert any(name.startswith("Flex") for name in op_counts(content))
    reasons = _reasons(content)
    assert any(r.startswith("FlexBitwiseAnd") for r in reasons)
    assert any(r.startswith("FlexBitwiseAnd") for r in _reasons(content, "int8"))


def test_two_d_gather_fails():
    content = _convert(
        lambda ids: tf.gather(tf.constant(TABLE), ids), [tf.TensorSpec([2, 3], tf.int32)]
    )
    assert any(r.startswith("GATHER") and "1-D" in r for r in _reasons(content))


@pytest.mark.slow
def test_rejected_ops_and_softmax_beta_fail():
    content = _convert(
        lambda x: tf.argmax(tf.nn.softmax(x * 1.0, axis=-1), axis=-1, output_type=tf.int32),
        [tf.TensorSpec([1, 4, 6], tf.float32)],
    )
    assert (
        _reasons(content) == []
    )  # ARG_MAX runs on LiteRT's GPU accelerator (calibration case arg_max)
    nd = _convert(
        lambda ids: tf.gather_nd(tf.constant(TABLE), ids), [tf.TensorSpec([1, 5, 1], tf.int32)]
    )
    assert any(r.startswith("GATHER_ND: not supported") for r in _reasons(nd))
    # SOFTMAX with beta 2: set in the flatbuffer itself (the converter keeps a MUL).
    content = _convert(_clean, [tf.TensorSpec([5], tf.int32, name="ids")])
    edited = gpu_calibration_models.with_softmax_beta(content, 2.0)
    assert _reasons(edited) == ["SOFTMAX: SOFTMAX beta 2.0 != 1"]


def test_int8_rules():
    data = [np.random.default_rng(i).standard_normal((1, 4)).astype("float32") for i in range(20)]
    w = tf.constant(W)
    full = _convert(
        lambda x: tf.nn.relu(tf.matmul(x, w)), [tf.TensorSpec([1, 4], tf.float32)], int8_data=data
    )
    assert _reasons(full, "int8") == []
    floating = _convert(lambda x: tf.nn.relu(tf.matmul(x, w)), [tf.TensorSpec([1, 4], tf.float32)])
    assert any("FULLY_CONNECTED" in r and "float" in r for r in _reasons(floating, "int8"))


@pytest.mark.slow
def test_keras_default_litert_export_is_flagged(tmp_path):
    """Regression: Keras's own `model.export(format="litert")` of an Embedding +
    MultiHeadAttention + LayerNormalization model is not GPU-clean, and check says so."""
    import keras

    ids = keras.Input((8,), batch_size=1, dtype="int32", name="ids")
    x = keras.layers.Embedding(20, 16)(ids)
    x = x + keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    x = keras.layers.LayerNormalization()(x)
    model = keras.Model(ids, keras.layers.Dense(3, activation="softmax")(x))
    path = str(tmp_path / "keras_default.tflite")
    model.export(path, format="litert", verbose=False)
    with open(path, "rb") as f:
        problems = check_model(f.read(), "gpu")
    assert problems
    assert any(p.op == "GATHER" for p in problems), [str(p) for p in problems]
    print("\n".join(map(str, problems)))


def test_cli_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.tflite"
    good.write_bytes(_convert(_clean, [tf.TensorSpec([5], tf.int32, name="ids")]))
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(
        _convert(lambda ids: tf.gather(tf.constant(TABLE), ids), [tf.TensorSpec([2, 3], tf.int32)])
    )
    assert main(["check", str(good), "--target", "gpu"]) == 0
    assert main(["check", str(bad), "--target", "gpu"]) == 1
    out = capsys.readouterr().out
    assert "GATHER" in out and "1-D" in out
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"not a model")
    for argv in (
        ["check", str(tmp_path / "missing.tflite")],
        ["check", str(junk)],
        ["check", str(good), "--target", "npu"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
