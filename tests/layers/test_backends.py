"""layers/ is backend-agnostic: the same checks pass under JAX."""

import pytest

from tests.support.backends import run_under_jax

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out


def test_layers_run_on_another_backend():
    stdout = run_under_jax("tests.support.backend_check", timeout=600)
    assert "backend jax: all checks passed" in stdout
