"""Seq2seq end to end: a tiny CLI run that learns the copy task, save/load, the
translate CLI, SavedModel `translate` in a fresh process, LiteRT step decoding
against Keras greedy decoding, resume, and bad inputs (one line, exit 2)."""

import gzip
import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

import zoo.models  # noqa: F401  (registers every class zoo model files name)
from tests.support import clock, tiny
from tests.support.paths import ROOT
from train import checkpoint
from train.cli import main as train_main
from zoo.seq2seq import decoding
from zoo.seq2seq.tokenization import EOS_ID, encode_proto, train_sentencepiece

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

TINY = [
    "--task-length",
    "5",
    "--train-size",
    "3000",
    "--epochs",
    "8",
    "--warmup-steps",
    "30",
    "--hidden-dim",
    "64",
    "--intermediate-dim",
    "128",
    "--dev-sample",
    "0",
    "--verbose",
    "0",
    "--max-minutes",
    "0",
]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("s2s") / "copy")
    assert train_main(["seq2seq", "--task", "copy", "--out", out, *TINY]) == 0
    return out


def _metrics(run):
    with open(os.path.join(run, "metrics.json")) as f:
        return json.load(f)


def test_tiny_run_learns_copy_and_writes_the_contract(copy_run):
    metrics = _metrics(copy_run)
    assert metrics["test_exact_match"] >= 0.95, metrics["test_exact_match"]
    assert metrics["decode_tokens_per_second"] > 0
    with open(os.path.join(copy_run, "config.json")) as f:
        config = json.load(f)
    assert config["kind"] == "seq2seq" and config["model"]["hidden_dim"] == 64
    assert config["train"]["schedule"] == "cosine"  # auto, for an embedded task
    assert config["train"]["average_last"] == 1  # auto, for an embedded task
    for name in (
        "model.keras",
        "vocab/spm.model",
        "vocab/pieces.txt",
        "calibration.npz",
        "logs",
        "attention.png",
    ):
        assert os.path.exists(os.path.join(copy_run, name)), name
    state = checkpoint.latest(os.path.join(copy_run, "checkpoints"))[1]["state"]
    assert state["epoch"] == 8 and state["best"]["epoch"] == metrics["best_epoch"]
    with np.load(os.path.join(copy_run, "calibration.npz")) as calib:
        assert calib["source_ids"].shape[1] == config["model"]["max_source_length"]


def test_cross_attention_figure_reads_the_model_and_leaves_it_whole(copy_run):
    from train.seq2seq.figures import cross_attention

    model = keras.models.load_model(os.path.join(copy_run, "model.keras"), compile=False)
    block = model.decoder_blocks[-1]
    layer = block.cross_attention_layer
    source, output, weights = cross_attention(model, "abcde")
    assert source == list("abcde") and output == list("abcde"), (source, output)
    assert weights.shape == (model.num_heads, 5, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)  # a softmax over the source
    # Copying: for most written characters the heads look hardest at the one copied.
    assert (weights.mean(0).argmax(-1) == np.arange(5)).sum() >= 3, weights.mean(0).round(2)
    assert block.cross_attention_layer is layer
    assert model.translate(["abcde"]) == ["abcde"]


def test_loaded_model_translates_raw_strings(copy_run):
    model = keras.models.load_model(os.path.join(copy_run, "model.keras"), compile=False)
    texts = ["abcde", "jjab", "hgfed"]
    assert model.translate(texts) == texts
    assert model.translate(texts, beam_width=3) == texts


def test_zoo_load_generates_with_every_sampler(copy_run):
    from zoo.seq2seq import samplers

    translator = zoo.load(copy_run)
    texts = ["abcde", "jjab"]
    assert (translator.kind, translator.format) == ("seq2seq", "keras")
    assert translator.generate(texts) == texts == translator.translate(texts)
    best = translator.generate(
        texts,
        sampler=samplers.Beam(width=3, length_penalty=1.0),
        num_return_sequences=3,
        return_scores=True,
    )
    assert [row[0][0] for row in best] == translator.model.translate(texts, beam_width=3, alpha=1.0)
    for row in best:
        assert len(row) == 3 and len({t for t, _ in row}) == 3
    # Nucleus sampling at a low temperature: the trained copy is all but certain.
    drawn = translator.generate(
        "abcde",
        sampler=samplers.TopP(0.9, temperature=0.5),
        num_return_sequences=2,
        seed=0,
        return_scores=True,
    )
    assert [t for t, _ in drawn] == ["abcde", "abcde"] and all(s <= 0 for _, s in drawn)
    assert translator.generate(texts, sampler="top_k", seed=3) == translator.generate(
        texts, sampler="top_k", seed=3
    )


def test_save_load_keeps_numbers_config_and_tokenizer(tmp_path):
    proto = train_sentencepiece(["two dogs run", "un chien court", "a dog"] * 20, vocab_size=40)
    for kind, extra in (
        # cross_length_scale 2 < the 3 source tokens: the scaled path is saved too.
        ("seq2seq", {"share_embeddings": False, "position": "learned", "cross_length_scale": 2}),
        ("universal_transformer", {"num_steps": 2, "act": True}),
    ):
        model = zoo.build(
            kind,
            tokenizer=encode_proto(proto),
            hidden_dim=16,
            num_heads=2,
            intermediate_dim=32,
            max_target_length=8,
            **extra,
        )
        x = {"source_ids": np.array([[5, 6, 7, 0]]), "target_ids": np.array([[2, 8, 9]])}
        path = str(tmp_path / f"{kind}.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
        assert type(loaded) is type(model) and loaded.get_config() == model.get_config()
        np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
        assert loaded.translate(["two dogs"]) == model.translate(["two dogs"])


def test_translate_cli(copy_run, capsys):
    from zoo.translate import main

    assert main([copy_run, "abcde", "ddcba"]) == 0
    assert capsys.readouterr().out.split() == ["abcde", "ddcba"]
    assert main([copy_run, "a" * 200]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    with open(os.path.join(copy_run, "config.json")) as f:
        limit = json.load(f)["model"]["max_source_length"]
    assert len(err) == 1 and f"has 200 tokens, more than the model's {limit}" in err[0], err


_CLEAN_CLIENT = r"""
import json, sys
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = loaded.signatures["translate"](text=tf.constant(json.loads(sys.argv[2])))
assert not [m for m in sys.modules if m.split(".")[0] in ("layers", "zoo", "train", "export")]
print(json.dumps([s.decode() for s in out["translation"].numpy()]))
"""


def test_savedmodel_translate_from_a_fresh_process(copy_run, tmp_path):
    from export.savedmodel import export_savedmodel

    version = export_savedmodel(copy_run, str(tmp_path / "serving" / "copy"))
    texts = ["abcde", "eeeb", "jihgf"]
    model = keras.models.load_model(os.path.join(copy_run, "model.keras"), compile=False)
    want = model.translate(texts)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _CLEAN_CLIENT, version, json.dumps(texts)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == want
    # export verify: the served translate_ids gives the Keras greedy tokens.
    from export import verify

    report = verify.verify(copy_run, savedmodel=os.path.dirname(version), samples=8)
    assert report["savedmodel"]["ok"], report["savedmodel"]
    assert report["savedmodel"]["equal_fraction"] == {"tokens": 1.0}
    translator = zoo.load(os.path.dirname(version))  # the TF Serving base: highest version
    assert (translator.kind, translator.format) == ("seq2seq", "savedmodel")
    assert translator.generate(texts) == want and translator.translate(texts[0]) == want[0]
    # encode / decode_step signatures: every sampler (tests/zoo/test_tflite_samplers.py)
    assert translator.generate(texts, sampler="beam") == model.generate(texts, sampler="beam")
    import tensorflow as tf

    ids_fn = tf.saved_model.load(version).signatures["translate_ids"]
    limit = model.max_source_length
    cases = [
        (np.full((1, 3), model.vocabulary_size, "int32"), "source_ids must be <"),
        (np.full((1, 3), -4, "int32"), "source_ids must be >= 0"),
        (np.ones((1, limit + 1), "int32"), "more positions than max_source_length"),
    ]
    for ids, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            ids_fn(source_ids=tf.constant(ids))


def test_litert_step_decoding_equals_keras_greedy(copy_run, tmp_path):
    from export.kinds import seq2seq as kind

    model = keras.models.load_model(os.path.join(copy_run, "model.keras"), compile=False)
    result = kind.export_all(copy_run, str(tmp_path / "tflite"))
    from export.check import check_model, op_name, read_model

    with open(result["steps"], "rb") as f:
        steps = f.read()
    graph = read_model(steps)
    ops = {op_name(graph, op) for sg in graph.subgraphs for op in (sg.operators or [])}
    assert not [o for o in ops if o.startswith(("Flex", "CUSTOM"))] and "WHILE" not in ops
    # The app-driven step model is the GPU export mode: no rank-5 caches.
    assert [str(p) for p in check_model(steps, "gpu")] == []
    assert result["steps_gpu_compatible"]
    s = model.max_source_length
    # The app loop of docs/deploy.md, one decode_step call per token.
    app_loop = zoo.litert.StepModel.from_interpreter(zoo.litert.interpreter(result["steps"]))
    for text in ["abcde", "ba", "jjjjj"]:
        ids = np.zeros((1, s), "int32")
        row = model.tokenizer.encode([text])[0]
        ids[0, : len(row)] = row
        want = np.asarray(decoding.greedy(model, ids))[0].tolist()
        want = want[: want.index(EOS_ID) + 1]
        assert app_loop.greedy(ids, model.max_target_length)[0] == want
        assert model.tokenizer.decode([want]) == [text]
    # zoo.load runs either file on raw text (the sidecar carries the SentencePiece model).
    texts = ["abcde", "ba", "jjjjj"]
    for path in (result["steps"], result["greedy"]):
        translator = zoo.load(path)
        assert (translator.kind, translator.format) == ("seq2seq", "tflite")
        assert translator.generate(texts) == model.translate(texts) == texts


def test_export_refuses_litert_tokens_that_differ_and_keeps_the_earlier_export(
    copy_run, tmp_path, monkeypatch, capsys
):
    """A step model whose greedy tokens differ from Keras's fails the export (exit 1, one
    line naming the row) and leaves the files of an earlier export as they were."""
    from export.kinds import seq2seq as kind

    out = tmp_path / "tflite"
    out.mkdir()
    (out / "steps.tflite").write_bytes(b"an earlier export")
    # One token off the step loop's own answer, as a faulty conversion would give.
    real = zoo.litert.StepModel.greedy

    def off_by_one(self, *args, **kwargs):
        ids, score = real(self, *args, **kwargs)
        return [t + 1 for t in ids], score

    monkeypatch.setattr(zoo.litert.StepModel, "greedy", off_by_one)
    assert kind.main([copy_run, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("export failed: row 0: LiteRT tokens differ from Keras greedy")
    assert sorted(os.listdir(out)) == ["steps.tflite"]
    assert (out / "steps.tflite").read_bytes() == b"an earlier export"


def test_resume_continues_from_the_checkpoint(shared_runs, tmp_path, capsys):
    # A copy of the pages' one-epoch run (shared, read-only), one epoch more.
    run = str(tmp_path / "resumed")
    shutil.copytree(shared_runs.command("train", tiny.PAGE_RUNS["seq2seq"]), run)
    code = train_main(["seq2seq", "--out", run, "--resume", "--epochs", "2", "--verbose", "0"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert _metrics(run)["epochs"] == 2
    assert "resuming" in err


def _write(path, lines, gz=False):
    data = "".join(f"{line}\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
    return str(path)


def _bad(capsys, argv, *needles):
    code = train_main(["seq2seq", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


def test_bad_inputs_one_line_exit_2(tmp_path, capsys):
    src = _write(tmp_path / "src.gz", ["a dog", "a cat", "a cow"], gz=True)
    tgt3 = _write(tmp_path / "tgt.txt", ["un chien", "un chat", "une vache"])
    tgt2 = _write(tmp_path / "tgt2.txt", ["un chien", "un chat"])
    empty = _write(tmp_path / "empty.txt", ["un chien", "", "une vache"])
    out = str(tmp_path / "run")
    _bad(
        capsys,
        ["--train-source", src, "--train-target", tgt2, "--out", out],
        "mismatched line counts",
        "3",
        "2",
    )
    _bad(
        capsys,
        ["--train-source", src, "--train-target", empty, "--out", out],
        "empty line 2",
        "empty.txt",
    )
    _bad(capsys, ["--dataset", "tfds:no_such_dataset_zz", "--out", out], "no_such_dataset_zz")
    _bad(capsys, ["--task", "juggle", "--out", out], "juggle")
    _bad(capsys, ["--train-source", src, "--out", out], "--train-target")
    _bad(
        capsys,
        ["--train-source", str(tmp_path / "missing.en"), "--train-target", tgt3, "--out", out],
        "not found",
        "missing.en",
    )
    tsv = _write(tmp_path / "bad.tsv", ["a dog\tun chien", "a cat un chat"])
    _bad(capsys, ["--train-tsv", tsv, "--out", out], "line 2", "tab")
    long_src = _write(tmp_path / "long.en", ["word " * 40] + ["a dog"] * 300)
    long_tgt = _write(tmp_path / "long.fr", ["mot"] + ["un chien"] * 300)
    _bad(
        capsys,
        [
            "--train-source",
            long_src,
            "--train-target",
            long_tgt,
            "--max-source-length",
            "16",
            "--vocab-size",
            "40",
            "--out",
            out,
        ],
        "over the limit 16",
        "pair 1",
    )
    assert not os.path.exists(out)
    os.makedirs(out)
    _write(os.path.join(out, "notes.txt"), ["mine"])
    _bad(capsys, ["--task", "copy", "--out", out], "not a run directory")
    assert os.listdir(out) == ["notes.txt"]


def test_summarisation_run_with_local_window_reports_rouge(tmp_path):
    # Document/summary pairs through the same CLI: the summary is the document's
    # first three words; the encoder attends within a local window.
    rng = np.random.default_rng(0)
    words = "the a dog cat sat ran on under mat rug big small red blue".split()
    docs = [" ".join(rng.choice(words, size=12)) for _ in range(300)]
    pairs = [f"{d}\t{' '.join(d.split()[:3])}" for d in docs]
    train = _write(tmp_path / "train.tsv", pairs[:240])
    test = _write(tmp_path / "test.tsv", pairs[240:])
    out = str(tmp_path / "summ")
    code = train_main(
        [
            "seq2seq",
            "--train-tsv",
            train,
            "--test-tsv",
            test,
            "--window",
            "4",
            "--vocab-size",
            "40",
            "--hidden-dim",
            "32",
            "--intermediate-dim",
            "64",
            "--num-layers",
            "1",
            "--epochs",
            "1",
            "--max-minutes",
            "0",
            "--dev-sample",
            "0",
            "--verbose",
            "0",
            "--beam-width",
            "1",
            "--out",
            out,
        ]
    )
    assert code == 0
    metrics = _metrics(out)
    for key in ("test_bleu", "test_rouge1", "test_rouge2", "test_rougeL"):
        assert 0.0 <= metrics[key] <= 100.0, (key, metrics[key])
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["model"]["window"] == 4
    assert config["train"]["schedule"] == "inverse_sqrt"  # auto, for text
    assert config["train"]["average_last"] == 3  # auto, for text
    model = keras.models.load_model(os.path.join(out, "model.keras"), compile=False)
    encoder_attention = model.encoder_blocks[0].self_attention
    assert encoder_attention.window == 4


def test_bad_input_exit_code_from_a_real_process(tmp_path):
    src = _write(tmp_path / "a.en", ["x", "y"])
    tgt = _write(tmp_path / "a.fr", ["x"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "train",
            "seq2seq",
            "--train-source",
            src,
            "--train-target",
            tgt,
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: mismatched line counts: {src} has 2 lines, {tgt} has 1"
    ]


@pytest.mark.parametrize("schedule", ["inverse_sqrt", "cosine"])
def test_learning_rate_follows_the_schedule_formula(schedule):
    from train.engine import At
    from train.seq2seq.fit import learning_rate

    peak, warmup, total = 2e-3, 200, 3000
    steps = np.array([0, 99, 199, 200, 1000, 1600, 2999, 3000, 4000])
    compiled, rate = learning_rate(peak, warmup, schedule, total)
    if schedule == "cosine":  # from zero up to the peak, then half a cosine down to zero
        assert compiled == peak  # the step sets the optimizer's rate from its `At`
        got = [rate(At(int(s), s / total)) for s in steps]
        after = np.clip((steps - warmup) / (total - warmup), 0, 1)
        want = np.where(
            steps < warmup, peak * steps / warmup, peak * 0.5 * (1 + np.cos(np.pi * after))
        )
    else:  # Vaswani et al.: min(step / warmup, sqrt(warmup / step)), steps counted from 1
        assert rate is None
        got = [float(compiled(s)) for s in steps]
        n = steps + 1.0
        want = peak * np.minimum(n / warmup, np.sqrt(warmup / n))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)


def test_a_cosine_schedule_ends_where_the_time_budget_stops_training(tmp_path, monkeypatch):
    # The default 30 epochs of 50-ms steps do not fit in 6 s: the clock stops the run,
    # and the cosine's learning rate has followed the clock down to zero by the last step.
    clock.fixed_step_clock(monkeypatch, 0.05)
    out = str(tmp_path / "cosine")
    flags = TINY[: TINY.index("--epochs")] + TINY[TINY.index("--epochs") + 2 : -2]
    args = ["--task", "copy", "--schedule", "cosine", "--max-minutes", "0.1", "--out", out]
    assert train_main(["seq2seq", *flags, *args]) == 0
    with open(os.path.join(out, "config.json")) as f:
        recorded = json.load(f)["train"]
    assert recorded["epochs"] == 30 and _metrics(out)["epochs"] < 30
    assert _metrics(out)["stopped_by_time_limit"]
    with np.load(checkpoint.latest(os.path.join(out, "checkpoints"))[0]) as saved:
        final = float(saved["optimizer/learning_rate"])
    assert 0.0 <= final < 0.02 * recorded["learning_rate"], final


def test_ema_run_saves_the_moving_average_and_checkpoints_the_raw_weights(tmp_path):
    out = str(tmp_path / "ema")
    args = ["seq2seq", "--task", "copy", *tiny.SEQ2SEQ, "--ema", "0.5", "--out", out]
    args += ["--batch-size", "16", "--warmup-steps", "1"]  # 4 steps at full speed
    assert train_main(args) == 0
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["train"]["ema_momentum"] == 0.5
    model = keras.models.load_model(os.path.join(out, "model.keras"), compile=False)
    saved = model.source_embedding.embeddings.numpy()
    # The last step's checkpoint: the raw weights training goes on from, and the
    # optimizer's moving average of them, which evaluation and the saved model use.
    with np.load(os.path.join(out, "checkpoints", "step-00000004.npz")) as step:
        raw = step["model/seq2_seq_transformer/source_embedding/embeddings"]
        average = step["optimizer/seq2_seq_transformer/source_embedding/embeddings:average"]
    assert np.max(np.abs(raw - average)) > 1e-4
    np.testing.assert_array_equal(saved, average)


def test_average_last_saves_the_mean_of_the_last_epochs_or_the_best_epoch(tmp_path):
    out = str(tmp_path / "averaged")
    args = ["seq2seq", "--task", "copy", *tiny.SEQ2SEQ, "--epochs", "3", "--out", out]
    assert train_main([*args, "--average-last", "2"]) == 0
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["train"]["average_last"] == 2
    metrics = _metrics(out)
    key = "model/seq2_seq_transformer/source_embedding/embeddings"
    model = keras.models.load_model(os.path.join(out, "model.keras"), compile=False)
    saved = model.source_embedding.embeddings.numpy()
    epochs = checkpoint.list_checkpoints(os.path.join(out, "checkpoints"), "epoch")
    assert len(epochs) == 2
    if metrics["averaged_epochs"] is not None:  # the mean ranked at least as the best
        assert metrics["averaged_epochs"] == [2, 3]
        want = np.mean([np.load(p)[key] for p in epochs], axis=0)
        np.testing.assert_allclose(saved, want, rtol=1e-6, atol=1e-7)
    else:
        best = checkpoint.list_checkpoints(os.path.join(out, "checkpoints"), "best")[-1]
        np.testing.assert_array_equal(saved, np.load(best)[key])
    # --resume of the finished run with --average-last 1: the best epoch's weights alone,
    # re-evaluated and saved, and recorded as the run's option now.
    assert train_main([*args, "--resume", "--average-last", "1"]) == 0
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["train"]["average_last"] == 1
    assert _metrics(out)["averaged_epochs"] is None
    model = keras.models.load_model(os.path.join(out, "model.keras"), compile=False)
    best = checkpoint.list_checkpoints(os.path.join(out, "checkpoints"), "best")[-1]
    np.testing.assert_array_equal(model.source_embedding.embeddings.numpy(), np.load(best)[key])


def test_best_epoch_is_the_most_accurate_then_the_lowest_dev_loss():
    from train import engine

    _best = engine.highest("val_acc", ties="val_loss")  # the seq2seq run's rule

    epochs = [  # (val_acc, val_loss): a solved task's accuracy ties at 1.0
        {"val_acc": 0.98, "val_loss": 0.50},
        {"val_acc": 1.0, "val_loss": 0.56},
        {"val_acc": 1.0, "val_loss": 0.55},
        {"val_acc": 0.99, "val_loss": 0.40},
        {"val_acc": 1.0, "val_loss": 0.57},
    ]
    assert min(range(len(epochs)), key=lambda i: _best(epochs[i])) == 2
    assert _best({"loss": 1.0}) is None  # no dev set: no best epoch


def test_xla_training_steps_equal_the_plain_steps():
    """`--jit-compile` compiles the same training step: without dropout (whose
    random masks XLA draws differently) five steps under XLA end where five steps
    without it do, and the loss of every step agrees."""
    from train.model_step import TfModelStep, masked_mean_terms
    from train.seq2seq.fit import compile_seq2seq

    rng = np.random.default_rng(0)
    sources = rng.integers(3, 50, size=(16, 12)).astype("int32")
    targets = rng.integers(3, 50, size=(16, 10)).astype("int32")
    targets[:4, 7:] = 0  # padded rows, excluded from the loss
    batch = ({"source_ids": sources, "target_ids": targets}, targets)
    runs = {}
    for jit in (False, True):
        keras.utils.set_random_seed(0)
        model = zoo.build(
            "seq2seq",
            vocabulary_size=50,
            hidden_dim=16,
            num_layers=1,
            num_heads=2,
            intermediate_dim=32,
            dropout=0.0,
        )
        compile_seq2seq(model, 1e-3, 10, 0.1, jit_compile=jit)
        runner = TfModelStep(model, loss_terms=masked_mean_terms(model.loss, 0), jit_compile=jit)
        assert runner.jit_compile is jit
        runner.build(batch)
        initial = [v.numpy() for v in model.trainable_variables]
        losses = [runner.train(batch)["loss"][0] for _ in range(5)]
        runs[jit] = losses, [v.numpy() for v in model.trainable_variables]
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=0, atol=1e-5)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(initial, runs[False][1]))
    assert moved > 1e-3
    # Adam divides each gradient by its own size, so rounding differences of ~1e-7
    # grow to ~lr * steps on tiny gradients: compare with that scale, far below `moved`.
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(runs[True][1], runs[False][1]))
    assert diff < 2e-4, diff
