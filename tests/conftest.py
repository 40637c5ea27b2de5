"""Shared pytest setup: backend, logging, hypothesis profiles, clean Keras state."""

import gc
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


def pytest_collection_finish(session):
    """What collection imported (TensorFlow, Keras, JAX, the project, every test module)
    lives until the end; frozen, it is left out of every later garbage collection. The
    full collection that clear_session runs before each test walked all of it: about a
    second per test (~850 tests) on the 2-core VM. The collections still free everything
    the tests create."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def clean_keras_state():
    """Each test starts with float32 policy and an empty Keras session."""
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session()
    yield
    keras.config.set_dtype_policy("float32")


# `make test` runs files whole on two workers (--dist loadfile), and a worker takes the
# next file from the front of the queue. xdist's default queue puts the files with the
# most tests first, which left the longest files (a few tests of minutes each) for the
# end, one worker busy with them and the other idle. Longest first instead: the files
# below in this order (the heaviest measured on the 2-core VM, with the gc.freeze
# above), then every other file in pytest's order. A file missing here only runs
# later; nothing is left out.
LONGEST_FIRST = (
    "tests/train/test_jax_training.py",
    "tests/train/test_seq2seq.py",
    "tests/zoo/test_library_load.py",
    "tests/train/test_preemption.py",
    "tests/zoo/test_tflite_samplers.py",
    "tests/train/test_sagan_checkpoint.py",
    "tests/test_docs.py",
    "tests/export/test_stock_serving.py",
    "tests/train/test_sagan_distributed.py",
    "tests/train/test_checkpoint.py",
    "tests/train/test_sagan.py",
    "tests/train/test_distributed.py",
    "tests/layers/test_attention_memory.py",
    "tests/zoo/test_lite.py",
    "tests/export/test_deploy_docs.py",
    "tests/layers/test_backends.py",
    "tests/export/test_tflite.py",
    "tests/test_bad_inputs.py",
    "tests/zoo/test_decoding.py",
    "tests/export/test_gpu_accelerator.py",
    "tests/train/test_tagger.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath

    def key(item):
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: each file's tests, and the rest, keep their order
