"""Shared pytest setup: backend, logging, hypothesis profiles, clean Keras state."""

import gc
import os

from tests.support.backends import TEST_XLA_FLAGS  # imports no TensorFlow

# Before TensorFlow/Keras are imported anywhere.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA programs (jit_compile steps, XLA decoding) compiled at LLVM -O0 here and in the
# children that inherit this environment, as in the JAX children (backends.py says why).
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

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
    lives until the end; frozen, it is left out of the garbage collections (a full one
    walked all of it: about a second on the 2-core VM) until `clean_keras_state`'s
    periodic full collection, which unfreezes, collects and freezes again. Frozen here,
    not only at each test's start: the first file's module and session fixtures run
    before that."""
    gc.collect()
    gc.freeze()


# Resident memory (bytes) after the last full collection the fixture below ran.
_COLLECTED_AT = [0]
COLLECT_EVERY = 1 << 30  # bytes of growth


def _resident_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # no /proc: the peak, which only grows
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture(autouse=True)
def clean_keras_state():
    """Each test starts with float32 policy and an empty Keras session (layer names,
    the default graph, TensorFlow's kernel cache). Not with the full garbage collection
    clear_session runs by default before each test: it walks the worker's whole heap,
    which grows with every file a worker runs (module fixtures, traced graphs), and took
    2-5 s per test late in a worker's life (~2000 s of `make test`). A full collection
    runs instead when the process has grown by COLLECT_EVERY since the last one: the
    models the tests drop hold reference cycles, and Python's own collections count
    objects, not the bytes those hold (a worker reached 9.5 GB in a full run without
    any collection of its own).

    Between those, what earlier tests left is frozen as each test starts, so that the
    collections during a test walk only what the test made: TensorFlow's TFLite
    converter runs a full `gc.collect()` in every conversion, which walked the whole
    worker (about 15% of the time of the export-heavy files); Python's own oldest-
    generation collections did the same. The periodic collection unfreezes first, so
    nothing stays uncollected past it."""
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)
    if _resident_bytes() > _COLLECTED_AT[0] + COLLECT_EVERY:
        gc.unfreeze()
        gc.collect()
        _COLLECTED_AT[0] = _resident_bytes()
    gc.freeze()
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """Runs and exports made once per session for every test file that makes them with
    the same command (tests/support/shared_runs.py)."""
    from tests.support.shared_runs import SharedRuns, root

    return SharedRuns(root(tmp_path_factory))


@pytest.fixture(scope="session", autouse=True)
def _shared_text_seq2seq_folder(tmp_path_factory):
    """Where tests/support/text_seq2seq.py writes the export it shares across test files
    and workers: the session's shared folder, which `text_seq2seq()` callers (plain
    functions, not fixtures) cannot ask for themselves."""
    from tests.support import text_seq2seq
    from tests.support.shared_runs import root

    text_seq2seq.FOLDER[0] = root(tmp_path_factory)


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
    "tests/export/test_serving_totality.py",
    "tests/train/test_sagan_checkpoint.py",
    "tests/test_docs.py",
    "tests/train/test_length_generalisation.py",
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
