"""Runs and exports that several test files make with the same command, made once per
test session and shared by both xdist workers (the `shared_runs` fixture in
tests/conftest.py).

`SharedRuns.command(module, argv)` is `python -m MODULE ARGV`, run in the calling process
through MODULE's `main(argv)` as tests/test_docs.py runs the pages' commands, with the
value of its `--out` pointed into the session's shared folder. The first caller runs it
while holding a lock file and asserts exit 0; every later caller (in either worker) waits
for that and gets the same output. A command is known by its module and arguments (the
`--out` path by its last component): the pages' `python -m train seq2seq --task reverse
--out runs/mt` plus the tiny flags (tests/support/tiny.py PAGE_RUNS) and a test asking
for the same run are one run, and an export of a shared run names that run's shared
path. The outputs are read-only: a test that changes one copies it first.
"""

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import shutil

DONE = ".done"


def run_main(module, argv):
    """`python -m MODULE ARGV` in this process: MODULE's (or its package's __main__'s)
    main(argv); returns the exit code."""
    spec = importlib.util.find_spec(module)
    if spec.submodule_search_locations is not None:  # a package: `python -m` runs __main__
        module += ".__main__"
    return importlib.import_module(module).main(argv)


def root(tmp_path_factory):
    """The session's shared folder: beside the xdist workers' own base folders (their
    common parent), or the base folder itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / "shared-runs"
    path.mkdir(exist_ok=True)
    return path


def out_value(argv):
    """The value of `--out` in argv (None without one)."""
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--out="):
            return arg.split("=", 1)[1]
    return None


class SharedRuns:
    def __init__(self, folder):
        self.folder = folder

    def _key(self, module, argv):
        out = out_value(argv)
        assert out is not None, f"python -m {module} {argv}: no --out to share"
        named = [
            f"<out>/{os.path.basename(os.path.normpath(out))}" if a == out else a for a in argv
        ]
        text = json.dumps([module, named])
        return hashlib.sha256(text.encode()).hexdigest()[:16], text, out

    def command(self, module, argv):
        """The shared output (the `--out` path) of `python -m MODULE ARGV`, run once."""
        key, text, out = self._key(module, list(argv))
        folder = self.folder / key
        target = str(folder / os.path.basename(os.path.normpath(out)))
        with open(self.folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not (folder / DONE).exists():
                shutil.rmtree(folder, ignore_errors=True)  # a failed earlier attempt
                folder.mkdir()
                (folder / "command.json").write_text(text)
                shared = [target if a == out else a for a in argv]
                code = run_main(module, shared)
                assert code == 0, f"python -m {module} {' '.join(shared)} exited {code}"
                (folder / DONE).touch()
        return target

    def outputs(self, shared_out):
        """Every file and folder the command of `shared_out` wrote beside it (an export's
        sidecars too), with its name."""
        folder = os.path.dirname(shared_out)
        keep = {DONE, "command.json"}
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n not in keep]
