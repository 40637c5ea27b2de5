"""Every verdict fails closed (#47): `export tflite`'s and `export verify`'s parity
gates (zoo.litert.compare / gate), the real accelerator's verdict
(export/accelerator.py `_verdict`) and `export verify --accelerator gpu`'s report
(export/verify.py), both `accelerator.judge` on those gates, see FAIL for a
missing output, an empty reference, a crashed child or a run error, and a NaN;
the same inputs without the defect PASS, so each
case fails for its defect alone. No device and no TensorFlow model needed: the
results are what the accelerator's child process returns, built by hand."""

import numpy as np
import pytest

from export import accelerator, verify
from zoo import litert

PROBS = np.array([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]]], np.float32)
REF = {"probabilities": PROBS, "tag_ids": np.array([[0, 1]], np.int32)}


def _copy(outputs):
    return {k: np.array(v) for k, v in outputs.items()}


def _with_nan(outputs, name="probabilities"):
    out = _copy(outputs)
    out[name][0, 0, 0] = np.nan
    return out


# ---------------------------------------------------------------- parity gates
def _gate(reference, candidate, mask=None):
    return litert.gate(
        litert.compare(reference, candidate, mask=mask, class_output="probabilities"), 1e-4, 0.999
    )


def test_parity_gate_passes_equal_outputs():
    assert _gate(REF, _copy(REF)) == []


@pytest.mark.parametrize(
    "case,candidate,reference,needle",
    [
        ("missing output", {"tag_ids": REF["tag_ids"]}, REF, "'probabilities' is missing"),
        ("empty reference", _copy(REF), {}, "no reference outputs"),
        ("NaN in the candidate", _with_nan(REF), REF, "'probabilities' differs by inf"),
        ("NaN in the reference", _copy(REF), _with_nan(REF), "reference holds NaN"),
        ("other shape", {**REF, "probabilities": PROBS[:, :1]}, REF, "shape [1, 1, 3]"),
        ("wrong integers", {**REF, "tag_ids": np.array([[2, 2]], np.int32)}, REF, "equal on 0.0%"),
    ],
)
def test_parity_gate_fails_closed(case, candidate, reference, needle):
    why = _gate(reference, candidate)
    assert any(needle in w for w in why), (case, why)


def test_parity_gate_fails_when_the_mask_leaves_nothing_to_compare():
    why = _gate(REF, _copy(REF), mask=np.zeros((1, 2), bool))
    assert any("no position to compare" in w for w in why), why


def test_an_all_nan_candidate_does_not_agree_by_argmax_luck():
    """argmax of a NaN row is 0; the reference's argmax is 0 on the first row."""
    report = litert.compare(
        REF, {**REF, "probabilities": np.full_like(PROBS, np.nan)}, class_output="probabilities"
    )
    assert report["agreement"] == 0.0


# ---------------------------------------------------------------- the real accelerator
FEEDS = {"serving_default": [{"x": np.ones((1, 4), np.float32)}] * 2}


def _side(rows, **extra):
    entry = {
        "compiled": True,
        "fully_accelerated": True,
        "log": [],
        "run_log": [],
        "latency": {},
        "outputs": {"serving_default": rows},
    }
    entry.update(extra)
    return entry


def _result(cpu_rows, gpu_rows, cpu=None, gpu=None, crashed=None):
    return {
        "crashed": crashed,
        "cpu": _side(cpu_rows, **(cpu or {})),
        "gpu": _side(gpu_rows, **(gpu or {})),
    }


ROWS = [_copy(REF), _copy(REF)]
BAD_RESULTS = {
    "missing output": _result(ROWS, [_copy(REF), {"tag_ids": REF["tag_ids"]}]),
    "empty reference (no rows back)": _result([], []),
    "empty reference (a row without outputs)": _result([{}, {}], [{}, {}]),
    "crashed child": {"crashed": "the accelerator's process died (signal 11)"},
    "GPU run error": _result(ROWS, [], gpu={"run_error": "Failed to invoke"}),
    "CPU run error": _result([], ROWS, cpu={"run_error": "Failed to invoke"}),
    "CPU did not compile": _result([], ROWS, cpu={"compiled": False, "error": "bad model"}),
    "NaN from the GPU": _result(ROWS, [_copy(REF), _with_nan(REF)]),
    "NaN in the reference": _result([_copy(REF), _with_nan(REF)], [_copy(REF), _with_nan(REF)]),
}


def test_accelerator_verdict_passes_equal_outputs():
    assert accelerator._verdict(_result(ROWS, [_copy(REF), _copy(REF)]), FEEDS) == (
        True,
        "fully accelerated, outputs match CPU",
    )


@pytest.mark.parametrize("case", list(BAD_RESULTS))
def test_accelerator_verdict_fails_closed(case):
    accepted, why = accelerator._verdict(BAD_RESULTS[case], FEEDS)
    assert not accepted and why, case


def test_accelerator_verdict_fails_with_no_rows_fed():
    accepted, why = accelerator._verdict(_result([], []), {"serving_default": []})
    assert (accepted, why) == (
        False,
        "serving_default: 0 rows fed, 0 came back from CPU, 0 from the GPU",
    )
    assert accelerator._verdict(_result([], []), {}) == (
        False,
        "no signature was fed: nothing compared",
    )


def test_accelerator_verdict_wants_every_integer_equal_and_floats_within_tolerance():
    """The same comparison as `export verify --accelerator gpu` (compare_rows),
    integer outputs all equal for the calibration's verdicts."""
    off = _copy(REF)
    off["tag_ids"][0, 1] = 2
    accepted, why = accelerator._verdict(_result(ROWS, [_copy(REF), off]), FEEDS)
    assert not accepted and "'tag_ids' equal on 75.0% < 100.0%" in why, why
    off = {**_copy(REF), "probabilities": PROBS + np.float32(0.05)}
    accepted, why = accelerator._verdict(_result(ROWS, [_copy(REF), off]), FEEDS)
    assert not accepted and "'probabilities' differs by 0.05 > 0.03" in why, why


# ---------------------------------------------------------------- export verify --accelerator gpu
@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A real one-op .tflite (y = 2x + 1) for the static check and the CPU
    Interpreter; the accelerator's child answers what each test says."""
    path = tmp_path / "probe.tflite"
    path.write_bytes(accelerator._PROBE)
    monkeypatch.setattr(accelerator, "device_problem", lambda: None)
    y = {"y": np.array([[3.0, 5.0, 7.0, 9.0]], np.float32)}

    def answer(cpu_rows, gpu_rows, **kwargs):
        result = _result(cpu_rows, gpu_rows, **kwargs)
        monkeypatch.setattr(accelerator, "run_many_in_child", lambda *a, **k: [result])
        return verify.verify_accelerator(str(path), samples=2, runs=0)

    return answer, y


def test_verify_accelerator_passes_equal_outputs(probe):
    answer, y = probe
    report = answer([y, y], [y, y])
    assert report["ok"], report
    assert "verdict: PASS" in verify.format_accelerator_report(report)


@pytest.mark.parametrize(
    "case",
    [
        "missing output",
        "empty reference",
        "run error",
        "CPU run error",
        "not fully accelerated",
        "NaN",
        "rows lost",
        "crashed",
    ],
)
def test_verify_accelerator_fails_closed(probe, case):
    answer, y = probe
    nan = {"y": np.array([[3.0, np.nan, 7.0, 9.0]], np.float32)}
    report = {
        "missing output": lambda: answer([y, y], [y, {}]),
        "empty reference": lambda: answer([{}, {}], [y, y]),
        "run error": lambda: answer([y, y], [y, y], gpu={"run_error": "Failed to invoke"}),
        "CPU run error": lambda: answer([y, y], [y, y], cpu={"run_error": "Failed to invoke"}),
        "not fully accelerated": lambda: answer([y, y], [y, y], gpu={"fully_accelerated": False}),
        "NaN": lambda: answer([y, y], [y, nan]),
        "rows lost": lambda: answer([y], [y]),
        "crashed": lambda: answer([y, y], [y, y], crashed="the accelerator's process died"),
    }[case]()
    assert report["ok"] is False, (case, report)
    assert "verdict: FAIL" in verify.format_accelerator_report(report)


# ---------------------------------------------------------------- export verify (Keras vs exports)
INPUTS = {"word_ids": np.ones((1, 2), np.int32)}


def _verify_entry(candidate, reference=REF, inputs=INPUTS, quantize="none"):
    report = litert.compare(reference, candidate, class_output="probabilities")
    return verify._verdict(report, inputs, quantize)


def test_export_verify_passes_equal_outputs_and_int8_on_agreement():
    assert _verify_entry(_copy(REF))["ok"]
    # A full-int8 classifier: probabilities off by 0.1, the same argmax.
    off = {**_copy(REF), "probabilities": PROBS + np.float32(0.1) * (PROBS > 0.5)}
    assert _verify_entry(off, quantize="int8")["ok"]
    assert not _verify_entry(off, quantize="none")["ok"]


@pytest.mark.parametrize(
    "case,entry",
    [
        ("missing output", lambda: _verify_entry({"tag_ids": REF["tag_ids"]})),
        ("empty reference", lambda: _verify_entry(_copy(REF), reference={})),
        ("no sample rows", lambda: _verify_entry(_copy(REF), inputs={"word_ids": np.ones((0, 2))})),
        ("NaN", lambda: _verify_entry(_with_nan(REF))),
        ("NaN, int8", lambda: _verify_entry(_with_nan(REF), quantize="int8")),
    ],
)
def test_export_verify_fails_closed(case, entry):
    got = entry()
    assert got["ok"] is False and got["fails"], case
