"""`python -m train universal_transformer --compare`: the length flags and scores, a tiny
compare's metrics.json, table and plot, and the exported UT (SavedModel and LiteRT
steps) translating strings 10x the trained length as Keras does."""

import json
import os

import numpy as np
import pytest

from train.cli import main as train_main
from train.seq2seq import length

TINY = [
    "--train-size",
    "2000",
    "--eval-size",
    "16",
    "--epochs",
    "6",
    "--warmup-steps",
    "30",
    "--hidden-dim",
    "32",
    "--intermediate-dim",
    "64",
    "--dev-sample",
    "0",
    "--verbose",
    "0",
    "--max-minutes",
    "0",
]


def test_scores_count_characters_in_place_and_whole_strings():
    outputs = ["abcd", "abxd", "ab", "abcdef", ""]
    refs = ["abcd", "abcd", "abcd", "abcd", "ab"]
    # characters right in place: 4, 3, 2 (missing tail), 4 (extra tail), 0
    assert length.score(outputs, refs) == (13, 18, 1)


def test_the_first_bucket_scores_the_outputs_already_decoded():
    # A compare's first bucket is its runs' test set: no model is asked again.
    pairs = [("ab", "ab"), ("cd", "dc")]
    (result,) = length.evaluate_buckets(None, [("1-2", 1, 2, pairs)], first=["ab", "cd"])
    assert (result["char_accuracy"], result["seq_accuracy"]) == (0.5, 0.5)
    assert result["sample"] == {"source": "ab", "reference": "ab", "output": "ab"}


def test_buckets_default_to_2_5_10_times_the_trained_length():
    class Args:
        train_lengths, test_lengths, task_length = "1-20", None, 8

    assert length.test_ranges(Args) == [(1, 20), (40, 40), (100, 100), (200, 200)]
    Args.test_lengths = "30-35, 400"
    assert length.test_ranges(Args) == [(1, 20), (30, 35), (400, 400)]
    assert length.bucket_name(200, 200, 20) == "10x (200)"
    assert length.bucket_name(1, 20, 20) == "1-20"


def test_the_summary_gives_each_bucket_the_mean_and_sample_std_over_seeds():
    runs = [
        {"arm": "transformer", "length": [{"char_accuracy": c, "seq_accuracy": 0.5}]}
        for c in (0.2, 0.4, 0.9)
    ]
    runs.append(
        {"arm": "universal_transformer", "length": [{"char_accuracy": 1.0, "seq_accuracy": 1.0}]}
    )
    arms, buckets = ["transformer", "universal_transformer"], [("1-5", 1, 5, [])]
    several, one = length.summarize(runs, arms, buckets)
    assert (several["seeds"], several["char_accuracy"]) == (3, [0.2, 0.4, 0.9])
    assert (several["char_accuracy_mean"], several["char_accuracy_std"]) == (0.5, 0.3606)  # ddof=1
    assert (several["seq_accuracy_mean"], several["seq_accuracy_std"]) == (0.5, 0.0)
    assert (one["seeds"], one["char_accuracy_mean"], one["char_accuracy_std"]) == (1, 1.0, 0.0)


@pytest.mark.parametrize("digits", [1, 7, 19, 200])
def test_addition_strings_of_any_length_add_up(digits):
    # 10x the trained length is far past int64: the numbers are drawn digit by digit.
    from train.seq2seq import algorithmic

    for source, target in algorithmic.generate("addition", 50, digits, digits, seed=digits):
        a, b = source.split("+")
        assert len(a) == digits and (digits == 1 or a[0] != "0") and 1 <= len(b) <= digits
        assert int(a) + int(b) == int(target)


def _model_config(argv, text=False, longest=20):
    from train.cli import build_parser
    from train.seq2seq.config import model_config

    return model_config(build_parser("seq2seq").parse_args(argv), text, longest)


def test_the_length_recipe_is_the_ut_default_on_embedded_tasks():
    keys = ("hidden_dim", "random_positions", "source_positions", "cross_length_scale")
    length = (128, True, "both_ends", 20)
    plain = (64, False, "start", 20)
    pick = lambda config: tuple(config[k] for k in keys)  # noqa: E731
    assert pick(_model_config(["--arch", "universal_transformer"])) == length
    assert pick(_model_config([])) == plain  # the Transformer's command: as given
    assert pick(_model_config(["--compare"])) == length  # every compare arm, the Transformer too
    assert pick(_model_config(["--compare", "--position", "learned"]))[1:3] == (False, "start")
    assert pick(_model_config(["--recipe", "length"])) == length
    assert pick(_model_config(["--arch", "universal_transformer", "--recipe", "plain"])) == plain
    # Flags given win over the recipe's size; text keeps its own model.
    ut = ["--arch", "universal_transformer"]
    assert _model_config([*ut, "--hidden-dim", "32"])["hidden_dim"] == 32
    text = _model_config(ut, text=True, longest=300)
    assert (text["hidden_dim"], text["random_positions"], text["cross_length_scale"]) == (
        256,
        False,
        128,  # the longest source, within the model's limit
    )
    assert _model_config([*ut, "--cross-length-scale", "off"])["cross_length_scale"] is None
    assert _model_config([*ut, "--cross-length-scale", "7"])["cross_length_scale"] == 7


def _bad(capsys, argv, needle):
    code = train_main(["universal_transformer", "--compare", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_bad_length_flags_one_line_exit_2(tmp_path, capsys):
    out = str(tmp_path / "cmp")
    _bad(capsys, ["--train-lengths", "20-1", "--out", out], "20-1")
    _bad(capsys, ["--train-lengths", "a-b", "--out", out], "'a-b'")
    _bad(capsys, ["--test-lengths", "40,x", "--out", out], "'x'")
    _bad(capsys, ["--seeds", "0", "--out", out], "--seeds")
    _bad(capsys, ["--arms", "transformer,lstm", "--out", out], "'lstm'")
    _bad(capsys, ["--task", "date", "--out", out], "date")
    _bad(capsys, ["--position", "learned", "--random-positions", "--out", out], "--position")
    _bad(capsys, ["--recipe", "length", "--position", "learned", "--out", out], "--recipe plain")
    _bad(capsys, ["--cross-length-scale", "1", "--out", out], "--cross-length-scale")
    _bad(capsys, ["--recipe", "short", "--out", out], "--recipe")
    assert not os.path.exists(out)


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("length") / "cmp")
    argv = [
        "universal_transformer",
        "--compare",
        "--task",
        "copy",
        "--train-lengths",
        "1-5",
        "--test-lengths",
        "10,50",
        "--seeds",
        "2",
        "--arms",
        "transformer,universal_transformer",
        # The length recipe (random positions, both-ends source positions) and
        # log-length cross-attention are the defaults; the export test covers them.
        "--out",
        out,
        *TINY,
    ]
    assert train_main(argv) == 0
    return out


@pytest.mark.slow
def test_compare_writes_the_table_plot_and_runs(compare_run):
    with open(os.path.join(compare_run, "metrics.json")) as f:
        metrics = json.load(f)
    assert [b["bucket"] for b in metrics["buckets"]] == ["1-5", "2x (10)", "10x (50)"]
    assert [(r["arm"], r["seed"]) for r in metrics["runs"]] == [
        ("transformer", 0),
        ("universal_transformer", 0),
        ("transformer", 1),
        ("universal_transformer", 1),
    ]
    for entry in metrics["summary"]:
        runs = [r for r in metrics["runs"] if r["arm"] == entry["arm"]]
        i = [b["bucket"] for b in metrics["buckets"]].index(entry["bucket"])
        for key in ("char_accuracy", "seq_accuracy"):
            values = [r["length"][i][key] for r in runs]
            assert entry[f"{key}_mean"] == pytest.approx(np.mean(values), abs=1e-4)
            assert entry[f"{key}_std"] == pytest.approx(np.std(values, ddof=1), abs=1e-4)
    # Every run learned something of the trained lengths: far more of them is right than
    # of 10x strings (the tiny budget does not learn them fully).
    for run in metrics["runs"]:
        trained, longest = run["length"][0], run["length"][-1]
        assert trained["char_accuracy"] > 2 * longest["char_accuracy"], run["name"]
    with open(os.path.join(compare_run, "accuracy_by_length.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    table = open(os.path.join(compare_run, "compare.md")).read()
    assert "| universal_transformer | 10x (50) | 2 |" in table
    # Every arm is a run directory of its own, its metrics with the length buckets.
    run = os.path.join(compare_run, "universal_transformer_seed1")
    with open(os.path.join(run, "config.json")) as f:
        config = json.load(f)
    assert config["kind"] == "universal_transformer"
    assert config["model"]["max_source_length"] >= 50
    # The recipe's positions; cross-attention scaled beyond the longest trained source
    # (the hidden size is the flag's: flags the user gives win over the recipe's).
    model = config["model"]
    assert (model["random_positions"], model["source_positions"]) == (True, "both_ends")
    assert (model["cross_length_scale"], model["hidden_dim"]) == (5, 32)
    with open(os.path.join(run, "metrics.json")) as f:
        assert [r["bucket"] for r in json.load(f)["length"]] == ["1-5", "2x (10)", "10x (50)"]


@pytest.mark.slow
def test_exported_ut_translates_10x_strings_as_keras(compare_run, tmp_path):
    import keras

    import zoo
    from export.kinds import seq2seq as kind
    from export.savedmodel import export_savedmodel

    run = os.path.join(compare_run, "universal_transformer_seed0")
    model = keras.models.load_model(os.path.join(run, "model.keras"), compile=False)
    rng = np.random.default_rng(5)
    texts = ["".join(rng.choice(list("abcdefghij"), 50)) for _ in range(3)]
    want = model.translate(texts)
    assert len({c for text in want for c in text}) > 3  # varied output, not one repeated token
    version = export_savedmodel(run, str(tmp_path / "serving" / "ut"))
    assert zoo.load(os.path.dirname(version)).translate(texts) == want
    steps = kind.export_all(run, str(tmp_path / "tflite"))["steps"]
    assert zoo.load(steps).translate(texts) == want
