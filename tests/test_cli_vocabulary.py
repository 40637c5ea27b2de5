"""One flag per concept across the train commands (`--jit-compile`, `--ema`,
`--verbose`, `--seed`, `--out`, `--config`), with the earlier names kept as hidden
aliases that set the same option."""

import importlib

import pytest

from train import cli, replay, strategy
from train.cli import main as train_main


def _parser(kind):
    parser = cli.OneLineParser(prog=kind)
    importlib.import_module(cli.COMMANDS[kind][0]).add_arguments(parser)
    strategy.add_arguments(parser)
    return parser


def _options(parser):
    return {o for a in parser._actions for o in a.option_strings}


@pytest.mark.parametrize("kind", ["tagger", "seq2seq", "universal_transformer", "sagan"])
def test_every_train_command_has_the_shared_flags(kind):
    options = _options(_parser(kind))
    assert {"--jit-compile", "--no-jit-compile", "--seed", "--out", "--resume"} <= options
    if kind in ("tagger", "sagan"):  # the two with weight averaging
        assert "--ema" in options
    if kind != "sagan":  # sagan is being reworked separately; it has no --verbose yet
        assert "--verbose" in options


@pytest.mark.parametrize("kind,old,new,dest,value", [
    ("tagger", ["--ema-momentum", "0.99"], ["--ema", "0.99"], "ema_momentum", 0.99),
    ("seq2seq", ["--xla"], ["--jit-compile"], "jit_compile", True),
])
def test_old_names_are_hidden_aliases(kind, old, new, dest, value, capsys):
    parser = _parser(kind)
    assert getattr(parser.parse_args(old), dest) == getattr(parser.parse_args(new), dest) == value
    parser.print_help()
    shown = capsys.readouterr().out
    assert new[0] in shown and old[0] + " " not in shown and old[0] + "\n" not in shown


def test_a_bad_value_names_the_flag_typed(capsys):
    for flag in ("--ema", "--ema-momentum"):
        assert train_main(["tagger", flag, "1.5"]) == 2
        assert capsys.readouterr().err.strip() == f"error: {flag} must be in [0, 1), got 1.5"
    assert train_main(["tagger", "--verbose", "3"]) == 2
    assert "--verbose must be auto, 0, 1 or 2" in capsys.readouterr().err


def test_seq2seq_derives_xla_from_jit_compile():
    from train import seq2seq

    for argv, xla in (([], False), (["--jit-compile"], True), (["--xla"], True),
                      (["--no-jit-compile"], False)):
        args = _parser("seq2seq").parse_args(argv)
        seq2seq.validate(args)
        assert args.xla is xla, argv


def test_replay_maps_recorded_old_names_to_the_canonical_flags():
    parser = _parser("seq2seq")
    config = {"kind": "seq2seq", "train": {"xla": True, "jit_compile": None, "task": "sort"}}
    argv = replay.config_argv(parser, config)
    assert "--jit-compile" in argv and "--xla" not in argv
    assert parser.parse_args(argv).jit_compile is True
    tagger = _parser("tagger")
    argv = replay.config_argv(tagger, {"kind": "tagger", "train": {"ema_momentum": 0.9}})
    assert argv == ["--ema", "0.9"]
