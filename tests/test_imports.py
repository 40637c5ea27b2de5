"""The package graph: imports flow layers <- zoo <- train / export with no cycles, and
importing the Keras-free parts (zoo, the config modules) has no side effects."""

import ast
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

PACKAGES = ("layers", "zoo", "train", "export")
# Which package may import which: the one-way flow README states.
ALLOWED = {
    "layers": {"layers"},
    "zoo": {"layers", "zoo"},
    "train": {"layers", "zoo", "train"},
    "export": {"layers", "zoo", "export"},
}


def _modules():
    mods = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    mods[dotted.removesuffix(".__init__")] = path
    return mods


def _graph():
    """module -> modules it imports anywhere in its file (function-level imports too:
    a cycle through a lazy import is still a cycle in the design)."""
    mods = _modules()

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in mods else node.module)
        graph[module] = {r for r in map(resolve, targets) if r and r != module}
    return graph


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_imports_flow_one_way():
    wrong = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if target.partition(".")[0] not in ALLOWED[module.partition(".")[0]]
    ]
    assert wrong == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "modules",
    [
        "zoo",
        "zoo.tagger.config",
        "train.seq2seq.config",
        "train.tagger",
        "train.seq2seq",
        "train.sagan",
        "train.cli",
    ],
)
def test_keras_free_imports_have_no_side_effects(modules):
    """Importing these loads neither Keras nor TensorFlow, sets no environment
    variable and leaves stderr (fd 2) writable."""
    code = (
        "import os, sys\n"
        "before = dict(os.environ)\n"
        f"import {modules}\n"
        "heavy = sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules)\n"
        "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))\n"
        "print(heavy, changed)\n"
        "os.write(2, b'fd2-still-open')\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []"
    assert "fd2-still-open" in done.stderr
