"""Every code block of README.md and docs/*.md runs: a page's blocks in order, in one scratch
directory (the python blocks in one namespace; the shell blocks' files are there
for the python blocks after them, and the other way round).

Shell blocks (```sh / ```bash) hold `python -m MODULE ARGS` commands (comments
and `export VAR=value` allowed); each runs in this process through MODULE's
`main(argv)` and must exit 0. One substitution keeps them short: a
`python -m train KIND ...` command gets `TINY[KIND]` appended (later flags win),
a tiny model trained for one epoch on a small slice of the embedded data; every
other flag is the page's own. A training (without --resume), or an export of one,
that other tests make with the same arguments runs once per session
(tests/support/shared_runs.py, which asserts its exit 0) and is copied here.

An HTML comment right before a block marks the few that cannot or should not
run by default, and says why:
- `<!-- docs-test: parse only: REASON -->` (shell): needs what the tests do not
  have (several machines, GPUs, a TPU, a download, your data files). Each
  command is parsed by its CLI's own parser (every flag and value checked).
- `<!-- docs-test: slow: REASON -->`: runs only with `DOCS_RUN_SLOW=1` (about
  five minutes more on the 2-core VM); otherwise shell commands are parsed as
  above and python blocks compiled. The default run adds about 50 s there.
"""

import importlib
import os
import re
import shlex
import shutil

import pytest

from tests.support import tiny
from tests.support.paths import ROOT
from tests.support.shared_runs import out_value, run_main

DOCS = os.path.join(ROOT, "docs")
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
BLOCK = re.compile(
    r"(?:^<!-- docs-test: (?P<mark>[^\n]*?) -->\n(?:[ \t]*\n)*)?"
    r"^```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.S | re.M,
)
SHELL = ("sh", "bash")
# App code (docs/deploy.md): its tensor names and shapes are checked against a fresh
# export by tests/export/test_deploy_docs.py; nothing here can run it.
APP = ("kotlin", "swift")
# Paths from the repository root: the front page and every guide.
PAGES = ["README.md"] + sorted(f"docs/{name}" for name in os.listdir(DOCS) if name.endswith(".md"))
# Pages that must show runnable Python (one per model, and the layers page).
RUNNABLE = {f"docs/{name}" for name in ("tagger.md", "seq2seq.md", "sagan.md", "layers.md")}
MAX_MARKED = {"parse only": 7, "slow": 6}
RUN_SLOW = os.environ.get("DOCS_RUN_SLOW") == "1"

TINY = tiny.FLAGS


def _blocks(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return [(m["mark"], m["lang"], m["code"]) for m in BLOCK.finditer(f.read())]


def _commands(code):
    """A shell block's commands as argv lists (quotes may span lines)."""
    commands, pending = [], ""
    for line in code.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            argv = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        pending = ""
        if argv:
            commands.append(argv)
    assert not pending, f"unterminated quote in: {pending!r}"
    return commands


def _module(argv):
    if argv[0] == "export" and len(argv) == 2 and "=" in argv[1]:
        return "env", argv[1].split("=", 1)
    assert argv[:2] == ["python", "-m"] and len(argv) > 2, f"not `python -m MODULE ...`: {argv}"
    return argv[2], argv[3:]


# Modules whose parser lives inside main(): parsed by running main with its work stubbed.
_WORK = {"export.kinds.seq2seq": "export_all", "train.sagan.digits": "write_digits"}


def _parse(module, args, monkeypatch):
    """The command's own parser on its arguments (nothing runs)."""
    if module == "train":
        from train import cli

        cli.build_parser(args[0]).parse_args(args[1:])
    elif module == "export":
        from export.__main__ import build_parser

        build_parser().parse_args(args)
    elif module in _WORK:
        target = importlib.import_module(module)
        monkeypatch.setattr(target, _WORK[module], lambda *a, **k: {})
        assert target.main(args) == 0
    else:
        raise AssertionError(f"no parse-only support for python -m {module}")


# Commands whose output another test makes with the same arguments (tests/support/
# shared_runs.py): a training without --resume, and the exports of such a run.
SHAREABLE = ("train", "export", "export.kinds.seq2seq")


def _shareable(module, args, copies, env_changed):
    out = out_value(args)
    if module not in SHAREABLE or out is None or env_changed or "--resume" in args:
        return False
    if os.path.exists(out):  # a command that adds to what is there
        return False
    # Every input that is a file or folder here is a copy of a shared output.
    return all(a == out or not os.path.exists(a) or os.path.abspath(a) in copies for a in args)


def _run(module, args, shared_runs, copies, env_changed=False):
    """Runs `python -m MODULE ARGS` here and asserts exit 0. A shareable command runs
    once per session in whichever test asks first (shared_runs asserts the exit 0, on
    the same arguments) and its output is copied here; `copies` maps each copy to the
    shared output it came from, so a later command on it is shared too."""
    if module == "train":
        args = [*args, *TINY[args[0]]]
    out = out_value(args)
    if _shareable(module, args, copies, env_changed):
        shared = shared_runs.command(
            module, [copies.get(os.path.abspath(a), a) if a != out else a for a in args]
        )
        where = os.path.dirname(out)
        if where:
            os.makedirs(where, exist_ok=True)
        for path in shared_runs.outputs(shared):
            local = os.path.join(where, os.path.basename(path))
            if os.path.isdir(path):
                shutil.copytree(path, local)
            else:
                shutil.copy2(path, local)
        copies[os.path.abspath(out)] = shared
        return
    code = run_main(module, args)
    assert code == 0, f"python -m {module} {' '.join(args)} exited {code}"
    if out is not None:
        copies.pop(os.path.abspath(out), None)  # changed here: no longer a copy


def test_model_and_layer_pages_exist_with_python_blocks():
    assert RUNNABLE <= set(PAGES)
    for name in RUNNABLE:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            text = f.read()
        assert PYTHON.findall(text), name
        if name != "docs/layers.md":
            for section in ("## Train", "## Evaluate", "## Load", "## Export", "## Deploy"):
                assert section in text, (name, section)


def test_every_block_is_python_or_shell_and_marked_blocks_are_few_and_say_why():
    marks = {kind: [] for kind in MAX_MARKED}
    for name in PAGES:
        for mark, lang, _ in _blocks(name):
            assert lang in ("python", *SHELL, *APP), f"{name}: a ```{lang or '(no language)'} block"
            if mark is not None:
                found = re.fullmatch(r"(parse only|slow): (\S.{9,})", mark)
                assert found and (lang in SHELL or found[1] == "slow"), (name, mark)
                marks[found[1]].append((name, found[2]))
    for kind, found in marks.items():
        assert len(found) <= MAX_MARKED[kind], (kind, found)


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_code_blocks_run(name, tmp_path, monkeypatch, shared_runs):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs_" + name[:-3].replace("/", "_")}
    copies, env_changed = {}, False
    for i, (mark, lang, code) in enumerate(_blocks(name)):
        where = f"{name} block {i + 1} ({lang})"
        run = mark is None or (mark.startswith("slow:") and RUN_SLOW)
        if lang in APP:
            continue
        try:
            if lang == "python":
                compiled = compile(code, where, "exec")
                if run:
                    exec(compiled, namespace)
                continue
            for argv in _commands(code):
                module, args = _module(argv)
                if module == "env":
                    if run:
                        monkeypatch.setenv(*args)
                        env_changed = True
                elif run:
                    _run(module, args, shared_runs, copies, env_changed)
                else:
                    _parse(module, args, monkeypatch)
        except (Exception, SystemExit) as e:
            raise AssertionError(f"{where} failed: {e!r}\n{code}") from e
