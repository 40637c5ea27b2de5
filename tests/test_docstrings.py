"""Every docstring example (`>>>`) of every module in layers/ and zoo/ runs and gives
the output it shows."""

import doctest
import importlib
import os

import pytest

from tests.support.paths import ROOT


def _modules_with_examples():
    found = []
    for package in ("layers", "zoo"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(".py") and ">>> " in open(path, encoding="utf-8").read():
                    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found.append(module.removesuffix(".__init__"))
    return sorted(found)


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert "layers.multi_head_attention" in MODULES and "zoo.seq2seq.transformer" in MODULES


@pytest.mark.slow
@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, result
