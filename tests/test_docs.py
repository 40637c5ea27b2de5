"""Every ```python block of docs/*.md runs: the blocks of one page in order, in one
namespace, in a scratch directory (pages write small model files there)."""

import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = sorted(name for name in os.listdir(DOCS) if name.endswith(".md"))
# Pages that must show runnable Python (one per model, and the layers page).
RUNNABLE = {"tagger.md", "seq2seq.md", "sagan.md", "layers.md"}


def test_model_and_layer_pages_exist_with_python_blocks():
    assert RUNNABLE <= set(PAGES)
    for name in RUNNABLE:
        with open(os.path.join(DOCS, name), encoding="utf-8") as f:
            text = f.read()
        assert BLOCK.findall(text), name
        if name != "layers.md":
            for section in ("## Train", "## Evaluate", "## Load", "## Export", "## Deploy"):
                assert section in text, (name, section)


@pytest.mark.parametrize("name", [p for p in PAGES])
def test_python_blocks_run(name, tmp_path, monkeypatch):
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        blocks = BLOCK.findall(f.read())
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{name[:-3]}"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/{name} block {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/{name}, python block {i + 1} failed: {e!r}\n{code}") from e
