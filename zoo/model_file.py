"""Loading `.keras` files safely, with one clear error for any file that cannot be used.

Every CLI that reads a model file goes through `load`: Keras's `safe_mode=True` refuses
files that would run code while loading (a `Lambda` layer's pickled bytecode), and a
missing, truncated or corrupted archive is a `ModelFileError` naming the file, instead
of whatever Keras, zipfile or h5py raised half-way (a truncated zip reads as
"File not found" in Keras 3.15).
"""

import os
import zipfile
import zlib


class ModelFileError(ValueError):
    """A model file that cannot be loaded: missing, not a .keras archive, truncated,
    corrupted or unsafe."""


def check_archive(path):
    """Cheap structural checks, before Keras (and TensorFlow) are involved."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFileError(f"model file not found: {path}")
    if not os.path.isfile(path):
        raise ModelFileError(f"model file is not a regular file: {path}")
    if not zipfile.is_zipfile(path):
        raise ModelFileError(
            f"not a .keras model file (not a zip archive; truncated or corrupted?): {path}"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            broken = archive.testzip()  # CRC of every member: catches flipped bytes
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        OSError,
        EOFError,
        ValueError,
    ) as e:
        raise ModelFileError(f"corrupted .keras model file {path}: {e}") from None
    if broken is not None:
        raise ModelFileError(
            f"corrupted .keras model file {path}: member {broken!r} fails its checksum"
        )
    if "config.json" not in names:
        raise ModelFileError(f"not a .keras model file (no config.json inside): {path}")
    return path


def load(path, compile=False):
    """Loads `path` with `safe_mode=True`.

    Raises:
        ModelFileError: for every reason the file cannot be loaded.
    """
    path = check_archive(path)
    import keras

    import zoo.models  # noqa: F401  (registers the classes the file refers to)

    try:
        return keras.models.load_model(path, compile=compile, safe_mode=True)
    except Exception as e:  # noqa: BLE001  (Keras raises many types for bad files)
        message = " ".join(str(e).split())[:300] or type(e).__name__
        raise ModelFileError(f"cannot load model {path}: {message}") from None
