"""Every GPU-mode export on LiteRT's real GPU accelerator (`python -m export
verify FILE --accelerator gpu`): compiled with the GPU accelerator alone, fully
accelerated, outputs against LiteRT's CPU on the run's rows (argmax agreement
for the tagger, max abs diff for images and logits), and for seq2seq's
steps.tflite the whole greedy loop through encode / decode_step giving CPU's
tokens. Where there is no Vulkan device these tests skip with that reason; the
exit-3 path is tested everywhere (a process without a Vulkan driver)."""

import os
import subprocess
import sys

import pytest

from export import accelerator, tflite
from export.__main__ import main
from export.verify import verify_accelerator
from tests.support import tiny
from tests.support.paths import ROOT
from tests.support.runs import make_tagger_run

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out


@pytest.fixture(scope="module")
def gpu():
    problem = accelerator.device_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def tagger_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-tagger")
    run = str(base / "run")
    make_tagger_run(run)
    out = {}
    for quantize in ("none", "fp16"):
        out[quantize] = str(base / f"tagger_{quantize}.tflite")
        tflite.export_tflite(run, out[quantize], quantize=quantize, static_shape=True)
    return run, out


@pytest.mark.parametrize("quantize", ["none", "fp16"])
def test_tagger_static_export_passes_on_the_gpu(gpu, tagger_files, quantize):
    run, files = tagger_files
    report = verify_accelerator(files[quantize], samples=16, runs=1)
    assert report["source"] == os.path.abspath(run)  # rows from the run's calibration file
    assert report["static_problems"] == []
    assert report["compiled"] and report["fully_accelerated"], report.get("error")
    entry = report["signatures"]["serving_default"]
    assert entry["rows"] == 16 and entry["agreement"] >= 0.95, entry
    assert entry["max_abs_diff"]["probabilities"] <= entry["tolerance"]["probabilities"]
    assert entry["gpu_latency"]["p50_ms"] > 0
    assert report["ok"]


def test_cli_reports_a_pass(gpu, tagger_files, capsys):
    _, files = tagger_files
    assert (
        main(["verify", files["fp16"], "--accelerator", "gpu", "--samples", "2", "--runs", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "fully accelerated" in out
        and "argmax agreement" in out
        and out.strip().endswith("verdict: PASS")
    )


def test_sagan_generator_static_export_passes_on_the_gpu(gpu, tmp_path):
    import keras

    from zoo.sagan.model import build_generator

    keras.utils.set_random_seed(0)
    generator = build_generator(
        image_size=32, channels=1, num_classes=2, latent_dim=16, width=8, seed=1
    )
    path = str(tmp_path / "generator.tflite")
    tflite.export_tflite(generator, path, static_shape=True)
    report = verify_accelerator(path, samples=4, runs=2)
    assert report["static_problems"] == [] and report["fully_accelerated"], report
    entry = report["signatures"]["serving_default"]
    assert set(entry["max_abs_diff"]) == {"image"} and entry["max_abs_diff"]["image"] <= 0.02, entry
    assert report["ok"]


def test_seq2seq_greedy_loop_on_the_gpu_gives_cpu_tokens(gpu, tmp_path):
    """encode's cross_cache is off by 3.4 on the GPU where its graph holds a
    batch-broadcast BATCH_MATMUL or a low-rank ADD (both computed wrong)."""
    from export import rundir
    from export.kinds import seq2seq
    from train.cli import main as train_main

    run = str(tmp_path / "run")
    # One layer and 16 positions: the same op patterns, half the training time.
    assert (
        train_main(
            [
                "seq2seq",
                "--out",
                run,
                "--task",
                "copy",
                *tiny.SEQ2SEQ,
                "--num-layers",
                "1",
                "--max-source-length",
                "16",
                "--max-target-length",
                "16",
                "--beam-width",
                "1",
            ]
        )
        == 0
    )
    # steps.tflite as export_all writes it (its CPU parity with Keras is
    # test_tflite_samplers' business); the run gives the test rows.
    steps = str(tmp_path / "steps.tflite")
    with open(steps, "wb") as f:
        f.write(seq2seq.convert_steps(seq2seq.KIND.model(rundir.resolve(run))))
    report = verify_accelerator(run, tflite=steps, samples=8, runs=1)
    assert report["source"] == run
    assert report["static_problems"] == [] and report["fully_accelerated"]
    enc = report["signatures"]["encode"]
    assert enc["max_abs_diff"]["cross_cache"] <= enc["tolerance"]["cross_cache"], enc
    greedy = report["signatures"]["greedy"]
    # Rows may part only where CPU's two best logits are nearer than the GPU's
    # error (an untrained model has such near ties); none did on this model.
    assert greedy["rows"] == 8 and greedy["same_tokens"] + greedy["near_ties"] == 8, greedy
    assert report["ok"]


def test_without_a_vulkan_device_exit_3_after_the_static_check(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(accelerator._PROBE)
    env = dict(
        os.environ, VK_ICD_FILENAMES=str(tmp_path / "no-driver.json"), TF_CPP_MIN_LOG_LEVEL="2"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "verify",
            str(path),
            "--accelerator",
            "gpu",
            "--verbose",
            "0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "static check --target gpu: compatible" in lines[1]
    assert lines[-1].strip().startswith("no Vulkan device for LiteRT's GPU accelerator")
    assert "mesa-vulkan-drivers" in lines[-1]


def test_bad_input_exits_2(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for argv in (
        ["verify", str(tmp_path / "missing.tflite"), "--accelerator", "gpu"],
        ["verify", str(run), "--accelerator", "gpu"],
        ["verify", str(run), "--tflite", str(tmp_path / "x.tflite"), "--accelerator", "gpu"],
        ["verify", str(tmp_path / "m.tflite"), "--accelerator", "npu"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err


def test_a_model_that_kills_the_accelerator_process_gets_that_as_its_verdict(tmp_path, monkeypatch):
    """run_many_in_child: the model that crashed the child is reported as such
    and the models after it still run (in a new child)."""
    paths = []
    for name in ("first", "crash", "last"):
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(accelerator._PROBE)
        paths.append(str(path))
    monkeypatch.setattr(
        accelerator,
        "_JOB",
        accelerator._JOB.replace(
            "accelerator._child_main(sys.argv[2])",
            "import os, signal\n"
            "real = accelerator.Compiled\n"
            "def compiled(model, acc='gpu'):\n"
            "    if str(model).endswith('crash.tflite'):\n"
            "        os.kill(os.getpid(), signal.SIGSEGV)\n"
            "    return real(model, acc)\n"
            "accelerator.Compiled = compiled\n"
            "accelerator._child_main(sys.argv[2])",
        ),
    )
    feeds = {"serving_default": [{"x": [[1.0, 2.0, 3.0, 4.0]]}]}
    results = accelerator.run_many_in_child([(p, feeds, None, 0) for p in paths])
    assert "signal 11" in results[1]["crashed"]
    for r in (results[0], results[2]):
        assert r["crashed"] is None and r["cpu"]["compiled"]
        assert r["cpu"]["outputs"]["serving_default"][0]["y"].tolist() == [[3.0, 5.0, 7.0, 9.0]]
