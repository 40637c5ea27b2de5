"""layers/ is backend-agnostic: the same checks pass under JAX."""

import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out


@pytest.mark.parametrize("backend", ["jax"])
def test_layers_run_on_another_backend(backend):
    pytest.importorskip(backend)
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.backend_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert f"backend {backend}: all checks passed" in proc.stdout
