"""One flag per concept across the train commands (`--jit-compile`, `--ema`,
`--verbose`, `--seed`, `--out`, `--config`), and no second name for any of them;
`--verbose` on the export and zoo.* commands too."""

import importlib

import pytest

from tests.support.paths import ROOT
from train import cli
from train.cli import main as train_main


def _parser(kind):
    return cli.build_parser(kind)


def _options(parser):
    return {o for a in parser._actions for o in a.option_strings}


@pytest.mark.parametrize("kind", ["tagger", "seq2seq", "universal_transformer", "sagan"])
def test_every_train_command_has_the_shared_flags(kind):
    options = _options(_parser(kind))
    assert {"--jit-compile", "--no-jit-compile", "--seed", "--out", "--resume"} <= options
    assert "--ema" in options  # weight averaging
    if kind != "sagan":  # sagan is being reworked separately; it has no --verbose yet
        assert "--verbose" in options


@pytest.mark.parametrize("kind,old", [("tagger", "--ema-momentum"), ("seq2seq", "--xla")])
def test_earlier_names_are_gone(kind, old, capsys):
    assert train_main([kind, old] if old == "--xla" else [kind, old, "0.99"]) == 2
    assert f"unrecognized arguments: {old}" in capsys.readouterr().err


def test_a_bad_value_names_the_flag_typed(capsys):
    assert train_main(["tagger", "--ema", "1.5"]) == 2
    assert capsys.readouterr().err.strip() == "error: --ema must be in [0, 1), got 1.5"
    assert train_main(["tagger", "--verbose", "3"]) == 2
    assert "--verbose must be auto, 0, 1 or 2" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["tagger", "seq2seq", "universal_transformer", "sagan"])
def test_a_recorded_config_replays_to_the_same_config(kind):
    """config.json's "train" (train.config.record) -> --config flags -> parse -> the same
    config object: every recorded option survives, none is reset to a default."""
    import dataclasses

    from train import config

    module = importlib.import_module(cli.COMMANDS[kind][0])
    changed = {}
    for field in dataclasses.fields(module.CONFIG):  # a non-default value for each flag
        if not field.metadata["record"] or not field.metadata["help"]:
            continue
        default = field.default
        if field.name in ("arch", "task", "keep", "position", "verbose", "attention_resolution"):
            continue  # choices: the defaults stand
        if isinstance(default, bool):
            changed[field.name] = not default
        elif isinstance(default, (int, float)) or field.metadata["kind"] in (int, float):
            kind_ = field.metadata["kind"] or type(default)
            changed[field.name] = 5 if kind_ is int else 0.25
    if kind == "sagan":
        changed["image_size"] = 64
    if kind == "tagger":
        changed["model_option"] = ["hidden_dim=24", "num_heads=2"]
    recorded = config.record(module.CONFIG(**changed))
    argv = cli.config_argv({"kind": kind, "train": recorded})
    again = config.from_args(module.CONFIG, _parser(kind).parse_args(argv))
    assert config.record(again) == recorded


# ---------------------------------------------------------------- --verbose beyond train
def _export_argv(command, tmp):
    return {
        "savedmodel": ["savedmodel", tmp, "--out", tmp],
        "tflite": ["tflite", tmp, "--out", tmp],
        "check": ["check", tmp],
        "verify": ["verify", tmp],
        "bench": ["bench", tmp],
    }[command]


@pytest.mark.parametrize("command", ["savedmodel", "tflite", "check", "verify", "bench"])
def test_every_export_command_takes_verbose(command, tmp_path, capsys):
    from export.__main__ import build_parser
    from export.__main__ import main as export_main
    from zoo.cli import verbosity

    argv = _export_argv(command, str(tmp_path))
    for value, level in (("auto", 1), ("0", 0), ("1", 1), ("2", 2)):
        assert verbosity(build_parser().parse_args([*argv, "--verbose", value]).verbose) == level
    assert verbosity(build_parser().parse_args(argv).verbose) == 1
    assert export_main([*argv, "--verbose", "3"]) == 2
    # The train commands' message, word for word.
    assert capsys.readouterr().err.strip() == "error: --verbose must be auto, 0, 1 or 2, got '3'"


@pytest.mark.parametrize("module", ["zoo.tag", "zoo.translate", "zoo.generate"])
def test_every_zoo_command_takes_verbose(module, tmp_path, capsys):
    main = importlib.import_module(module).main
    args = {
        "zoo.tag": [str(tmp_path), "I saw"],
        "zoo.translate": [str(tmp_path), "abc"],
        "zoo.generate": [str(tmp_path), "--out", str(tmp_path / "g.png")],
    }[module]
    assert main([*args, "--verbose", "3"]) == 2
    # The train commands' message, word for word.
    assert capsys.readouterr().err.strip() == "error: --verbose must be auto, 0, 1 or 2, got '3'"
    assert "--verbose" in _help(main)


def _help(main):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(["--help"])
        except SystemExit as e:  # zoo.tag and zoo.generate parse inside their error boundary
            code = e.code
    assert code == 0
    return out.getvalue()


@pytest.mark.slow
def test_verbose_0_prints_the_results_and_nothing_else(tmp_path):
    """In fresh processes (the runtimes write to fd 2 directly): `--verbose 0` leaves
    stdout to the results and stderr empty; the default also says what was written."""
    import contextlib
    import io
    import os
    import subprocess
    import sys

    from tests.support.runs import make_tagger_run

    run = str(tmp_path / "run")
    make_tagger_run(run)
    root = ROOT
    env = {**os.environ, "PYTHONPATH": root}

    def cli(*argv, ok=(0,)):
        proc = subprocess.run(
            [sys.executable, "-m", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(tmp_path),
            timeout=300,
        )
        assert proc.returncode in ok, proc.stderr[-2000:]
        return proc.stdout, proc.stderr

    out, err = cli("zoo.tag", run, "I saw a saw", "--verbose", "0")
    assert (len(out.splitlines()), len(out.split()), err) == (1, 4, "")
    tfl = str(tmp_path / "t.tflite")
    assert cli("export", "tflite", run, "--out", tfl, "--verbose", "0") == ("", "")
    assert os.path.isfile(tfl)
    out, err = cli("export", "check", tfl, "--verbose", "0", ok=(0, 1))  # 1: not for the GPU
    assert "compatible with --target gpu" in out.splitlines()[-1] and err == ""
    # The default's stdout needs no fresh process.
    from export.__main__ import main as export_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert export_main(["tflite", run, "--out", str(tmp_path / "u.tflite")]) == 0
    assert out.getvalue().startswith("wrote ")
