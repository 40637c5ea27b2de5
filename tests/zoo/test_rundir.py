"""`zoo.rundir.saved_model_version_dir`: the one reader of TF Serving's version
layout that `zoo.load` and `python -m export verify|bench` share."""

import pytest

from export.verify import resolve_version_dir
from zoo.cli import UsageError
from zoo.rundir import saved_model_version_dir


def _saved_model(folder):
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"")


def test_a_saved_model_folder_is_itself(tmp_path):
    _saved_model(tmp_path / "m")
    assert saved_model_version_dir(str(tmp_path / "m")) == str(tmp_path / "m")


def test_the_highest_numbered_version_wins_numerically(tmp_path):
    for version in ("2", "10", "9"):
        _saved_model(tmp_path / "base" / version)
    (tmp_path / "base" / "11").mkdir()  # no saved_model.pb: not a version
    (tmp_path / "base" / "tmp").mkdir()
    assert saved_model_version_dir(str(tmp_path / "base")) == str(tmp_path / "base" / "10")
    assert resolve_version_dir(str(tmp_path / "base")) == str(tmp_path / "base" / "10")


@pytest.mark.parametrize("layout", ["missing", "empty", "file"])
def test_no_saved_model_is_none_for_zoo_and_a_usage_error_for_export(tmp_path, layout):
    path = tmp_path / "x"
    if layout == "empty":
        path.mkdir()
    elif layout == "file":
        path.write_text("not a folder")
    assert saved_model_version_dir(str(path)) is None
    with pytest.raises(UsageError, match="not a SavedModel or TF Serving model directory"):
        resolve_version_dir(str(path))
