"""`check --target gpu` against LiteRT's real GPU accelerator.

One small model per op family / shape situation the static rules talk about
(tests/support/gpu_calibration_models.py: dynamic dims, rank 5, gathers, ARG_MAX,
SOFTMAX beta, strided slices, WHILE, int8 and fp16, the two patterns the
accelerator computes wrong, ...). Each runs on the real accelerator
(`export.accelerator.real_verdicts`: compiles with the GPU alone, fully
accelerated, outputs within tolerance of LiteRT's CPU), and the static verdict
must be the same. Skipped, with the reason, where there is no Vulkan device.
"""

import pytest

from export import accelerator
from export.check import check_model
from tests.support import gpu_calibration_models as models

CASES = sorted(models.cases())

# The real accelerator's verdicts as measured (lavapipe, 2026-12-01); the test
# compares the checker with a fresh run, this table only guards against the set
# of cases silently losing its rejected (or accepted) half.
REJECTED = {
    "rank5",
    "gather_2d_indices",
    "softmax_beta_2",
    "strided_slice_shrink",
    "while",
    "batch_matmul_broadcast_lhs",
    "add_low_rank_runtime",
    "broadcast_to",
    "shape_dependent_reshape",
    "range_positions",
    "fill",
    "gather_nd",
    "pad_2d",
    "fp16_gather",
}


@pytest.fixture(scope="module")
def gpu():
    problem = accelerator.device_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def files(gpu, tmp_path_factory):
    """The cases' .tflite files, converted only where there is a device to run them on
    (the skip comes first)."""
    base = tmp_path_factory.mktemp("gpu-calibration")
    out = {}
    for name, (fn, specs, how) in models.cases().items():
        path = base / f"{name}.tflite"
        path.write_bytes(models.convert(fn, specs, how))
        out[name] = path
    return out


@pytest.fixture(scope="module")
def verdicts(gpu, files):
    names = sorted(files)
    return dict(zip(names, accelerator.real_verdicts([str(files[n]) for n in names])))


def test_cases_cover_both_verdicts():
    assert len(CASES) >= 20
    assert REJECTED < set(CASES) and len(REJECTED) >= 8 and len(set(CASES) - REJECTED) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_static_verdict_equals_the_real_accelerator(files, verdicts, name):
    problems = check_model(files[name].read_bytes(), "gpu")
    accepted, why = verdicts[name]
    assert (not problems) == accepted, (
        f"{name}: check says {'compatible' if not problems else [str(p) for p in problems]}, "
        f"the GPU accelerator says {why}"
    )
    assert accepted == (name not in REJECTED), why
