"""Shared pytest setup: backend, logging, hypothesis profiles, clean Keras state."""

import os

# Before TensorFlow/Keras are imported anywhere.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def clean_keras_state():
    """Each test starts with float32 policy and an empty Keras session."""
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session()
    yield
    keras.config.set_dtype_policy("float32")
