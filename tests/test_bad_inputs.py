"""Bad input, everywhere: one line on stderr naming the problem and the value, exit code 2,
no traceback, and nothing written or overwritten; the Python API raises ValueError/TypeError
naming the argument and the value; unsafe or damaged model files are refused.

CLI cases that fail before TensorFlow is imported run as real processes (cheap); cases that
need TensorFlow call the CLI's `main` in this process (TensorFlow is loaded once), and two
of them also run as real processes to prove the C++ runtimes print nothing extra.
"""

import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tests.support.paths import ROOT

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tagger")


# ---------------------------------------------------------------------------
# A sandbox of inputs, shared by every case (built once; never modified).


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def _lambda_model(path, marker):
    """A .keras file whose Lambda layer writes `marker` when its code runs."""
    import keras

    code = f"lambda x: (open({marker!r}, 'w').write('ran'), x)[1]"
    inp = keras.Input((4,))
    out = keras.layers.Lambda(eval(code))(inp)  # noqa: S307  (the attack under test)
    keras.Model(inp, out).save(path)
    os.remove(marker)  # building the model ran the lambda once; loading must not


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    from tests.support.runs import make_tagger_run

    root = str(tmp_path_factory.mktemp("bad_inputs"))
    tagger = os.path.join(root, "tagger_run")
    make_tagger_run(tagger)
    # A run of another kind (its model is not needed: the kind is read first).
    _write(
        os.path.join(root, "sagan_run", "config.json"),
        json.dumps({"kind": "sagan", "model": {"latent_dim": 8}}),
    )
    _write(
        os.path.join(root, "sagan_run", "model.keras"),
        open(os.path.join(tagger, "model.keras"), "rb").read(),
    )
    _write(os.path.join(root, "sagan_run", ".zoo-run"), "sagan\n")
    _write(os.path.join(root, "hover_run", "config.json"), json.dumps({"kind": "hovercraft"}))
    _write(os.path.join(root, "hover_run", "model.keras"), b"")
    model_bytes = open(os.path.join(tagger, "model.keras"), "rb").read()
    for name, data in (
        ("truncated_run", model_bytes[: len(model_bytes) // 2]),
        ("flipped_run", _flip_member_byte(model_bytes)),
        ("text_run", b"this is not a model\n"),
    ):
        _write(os.path.join(root, name, "config.json"), json.dumps({"kind": "tagger"}))
        _write(os.path.join(root, name, "model.keras"), data)
    _write(os.path.join(root, "lambda_run", "config.json"), json.dumps({"kind": "tagger"}))
    _lambda_model(os.path.join(root, "lambda_run", "model.keras"), os.path.join(root, "PWNED"))
    _write(os.path.join(root, "not_a_run", "notes.txt"), "my thesis\n")
    os.makedirs(os.path.join(root, "empty_dir"))
    # A run whose recorded options are another version's (a step checkpoint to resume).
    other = {"kind": "tagger", "train": {"epochs": 2, "hovering": True}}
    _write(os.path.join(root, "other_run", "config.json"), json.dumps(other))
    _write(os.path.join(root, "other_run", ".zoo-run"), "tagger\n")
    _write(os.path.join(root, "other_run", "checkpoints", "step-00000001.npz"), b"")
    # A run of this version's recorded options (the defaults), to resume with other flags.
    from train.config import record
    from train.tagger import TaggerConfig

    resumable = {"kind": "tagger", "train": record(TaggerConfig())}
    _write(os.path.join(root, "resumable_run", "config.json"), json.dumps(resumable))
    _write(os.path.join(root, "resumable_run", ".zoo-run"), "tagger\n")
    _write(os.path.join(root, "resumable_run", "checkpoints", "step-00000001.npz"), b"")
    # A run whose config.json records no options at all.
    _write(os.path.join(root, "bare_run", "config.json"), json.dumps({"kind": "tagger"}))
    _write(os.path.join(root, "bare_run", ".zoo-run"), "tagger\n")
    _write(os.path.join(root, "bare_run", "checkpoints", "step-00000001.npz"), b"")
    _write(os.path.join(root, "images", "cats", "a.png"), "not an image\n")
    _write(os.path.join(root, "existing.png"), b"\x89PNG keep me")
    _write(os.path.join(root, "garbage.tflite"), b"\x00" * 64)
    _write(os.path.join(root, "garbage2.tflite"), b"\x00" * 64)
    _write(
        os.path.join(root, "garbage.tflite.json"),
        json.dumps(
            {
                "kind": "tagger",
                "words": ["<pad>", "<unk>", "a"],
                "chars": ["<pad>", "<unk>", "a"],
                "tags": ["X"],
                "max_chars": 4,
                "max_len": 8,
            }
        ),
    )
    _write(
        os.path.join(root, "garbage2.tflite.json"), json.dumps({"kind": "sagan", "latent_dim": 8})
    )
    _write(
        os.path.join(root, "latin1.conllu"),
        open(os.path.join(FIXTURES, "small.conllu"), "rb").read().replace(b"saw", b"s\xe4w"),
    )
    _write(os.path.join(root, "src.txt"), "a b\nc d\n")
    _write(os.path.join(root, "tgt.txt"), "x y\n")
    _write(os.path.join(root, "latin1.txt"), b"caf\xe9\nthe\n")
    _write(os.path.join(root, "empty.txt"), "")
    _write(os.path.join(root, "pairs.tsv"), "a\tb\nno tab here\n")
    _write(os.path.join(root, "blank_line.txt"), "a\n\nb\n")
    _write(os.path.join(root, "three.txt"), "a\nb\nc\n")
    # Reliability II (#23): unreadable, empty, truncated, wrong-kind and non-UTF-8 inputs.
    _write(os.path.join(root, "binary.conllu"), bytes(range(256)) * 4)
    _write(os.path.join(root, "latin1.tsv"), b"caf\xe9\tx\n")
    import gzip

    _write(os.path.join(root, "truncated.txt.gz"), gzip.compress(b"a b c\n" * 100)[:30])
    _write(os.path.join(root, "images_file"), "not a directory\n")
    _write(os.path.join(root, "empty.tflite"), b"")
    _write(os.path.join(root, "latin1side.tflite"), b"\x00" * 64)
    _write(os.path.join(root, "latin1side.tflite.json"), b'{"kind": "tagg\xe9r"}')
    os.makedirs(os.path.join(root, "dir.tflite"))
    for name, config in (
        ("emptycfg_run", b""),
        ("truncfg_run", b'{"kind": "tag'),
        ("latincfg_run", b'{"kind": "tagg\xe9r"}'),
        ("listcfg_run", b"[1, 2]"),
    ):
        _write(os.path.join(root, name, "config.json"), config)
        _write(os.path.join(root, name, "model.keras"), model_bytes)
    _write(os.path.join(root, "seq_run", "config.json"), json.dumps({"kind": "seq2seq"}))
    _write(os.path.join(root, "seq_run", ".zoo-run"), "seq2seq\n")
    _write(os.path.join(root, "seq_run", "model.keras"), model_bytes)
    return root


def _flip_member_byte(data):
    """The same zip with one byte of the largest member's data changed (CRC now wrong)."""
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = max(z.infolist(), key=lambda i: i.compress_size)
    out = bytearray(data)
    name_len = int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    out[start + info.compress_size // 2] ^= 0xFF
    return bytes(out)


def snapshot(root):
    """Every file under root with its content hash (and every directory)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        state[os.path.relpath(dirpath, root) + "/"] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                state[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return state


def _expand(argv, root):
    return [a.replace("{R}", root).replace("{F}", FIXTURES) for a in argv]


def _check_output(rc, err, needle, code=2):
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == code, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in lines[0], (needle, lines[0])


# ---------------------------------------------------------------------------
# CLI cases that fail before TensorFlow is imported: real processes.

FAST = [
    # train: arguments
    (["train", "nosuchmodel"], "'nosuchmodel'"),
    (["train", "tagger", "--batch-size", "0"], "--batch-size must be > 0, got 0"),
    (["train", "tagger", "--epochs", "-1"], "--epochs must be >= 0, got -1"),
    (["train", "tagger", "--epochs", "abc"], "'abc'"),
    (["train", "tagger", "--arch", "transformerz"], "'transformerz'"),
    (["train", "tagger", "--learning-rate", "0"], "got 0.0"),
    (["train", "tagger", "--dataset", "ud_english"], "'ud_english'"),
    (["train", "tagger", "--out", "{R}/not_a_run"], "not a run directory"),
    (["train", "tagger", "--out", "{R}/tagger_run"], "already holds a run"),
    (["train", "tagger", "--resume", "--out", "{R}/nowhere"], "{R}/nowhere"),
    (["train", "tagger", "--resume", "--out", "{R}/sagan_run"], "'sagan' run, not 'tagger'"),
    (["train", "sagan", "--resume", "--out", "{R}/tagger_run"], "'tagger' run, not 'sagan'"),
    # train: data files
    (["train", "tagger", "--train-file", "{R}/missing.conllu"], "{R}/missing.conllu"),
    (["train", "tagger", "--train-file", "{F}/malformed.conllu"], "malformed.conllu:9"),
    (["train", "tagger", "--train-file", "{F}/empty.conllu"], "empty.conllu"),
    (["train", "tagger", "--train-file", "{R}/latin1.conllu"], "latin1.conllu: not UTF-8"),
    (
        [
            "train",
            "tagger",
            "--train-file",
            "{F}/small.conllu",
            "--dev-file",
            "{F}/malformed.conllu",
        ],
        "malformed.conllu:9",
    ),
    (["train", "tagger", "--dev-file", "{F}/small.conllu"], "need --train-file"),
    (["train", "seq2seq", "--task", "palindrome"], "'palindrome'"),
    (["train", "seq2seq", "--arch", "rnn"], "'rnn'"),
    (["train", "seq2seq", "--batch-size", "0"], "--batch-size must be > 0, got 0"),
    (["train", "seq2seq", "--dropout", "1.5"], "got 1.5"),
    (["train", "seq2seq", "--train-source", "{R}/missing.txt"], "{R}/missing.txt"),
    (["train", "seq2seq", "--resume", "--out", "{R}/tagger_run"], "'tagger' run"),
    (["train", "sagan", "--batch-size", "0"], "got 0"),
    (["train", "sagan", "--epochs", "-3"], "got -3"),
    (["train", "sagan", "--image-size", "33"], "got 33"),
    (["train", "sagan", "--dataset", "tfds:imagenet"], "'tfds:imagenet'"),
    (["train", "sagan", "--attention-resolution", "banana"], "'banana'"),
    (["train", "sagan", "--image-dir", "{R}/missing_dir"], "{R}/missing_dir"),
    (["train", "sagan", "--image-dir", "{R}/empty_dir"], "{R}/empty_dir"),
    (["train", "sagan", "--image-dir", "{R}/images"], "{R}/images/cats/a.png"),
    (["train", "sagan", "--out", "{R}/not_a_run"], "not a run directory"),
    # export: arguments and files that are checked without TensorFlow
    (
        ["export", "tflite", "{R}/tagger_run", "--out", "{R}/t.tflite", "--quantize", "int3"],
        "'int3'",
    ),
    (["export", "savedmodel", "{R}/tagger_run", "--out", "{R}/sm", "--version", "0"], "got 0"),
    (["export", "check", "{R}/missing.tflite"], "{R}/missing.tflite"),
    (["export", "check", "{R}/garbage.tflite"], "TFL3"),
    (["export", "check", "{R}/garbage.tflite", "--target", "tpu9"], "'tpu9'"),
    # Reliability II (#23): more inputs of each kind, all refused before TensorFlow.
    (
        ["train", "tagger", "--train-file", "{R}/empty_dir"],
        "data file is a directory: {R}/empty_dir",
    ),
    (["train", "tagger", "--train-file", "{R}/binary.conllu"], "binary.conllu: not UTF-8"),
    (
        ["train", "tagger", "--train-file", "{F}/small.conllu", "--test-file", "{R}/binary.conllu"],
        "binary.conllu: not UTF-8",
    ),
    (["train", "tagger", "--out", "{R}/existing.png"], "--out exists and is not a directory"),
    (["train", "tagger", "--out", "{R}/existing.png/run"], "{R}/existing.png is not a directory"),
    (["train", "tagger", "--checkpoint-every", "-1"], "--checkpoint-every must be >= 0, got -1"),
    (["train", "tagger", "--max-minutes", "-1"], "--max-minutes must be >= 0"),
    (["train", "tagger", "--ema", "1.5"], "--ema must be in [0, 1), got 1.5"),
    (["train", "tagger", "--seed", "x"], "'x'"),
    (["train", "tagger", "--strategy", "quantum"], "'quantum'"),
    (["train", "tagger", "--resume", "--out", "{R}/hover_run"], "'hovercraft' run"),
    (["train", "tagger", "--resume", "--out", "{R}/empty_dir"], "nothing to resume"),
    (["train", "tagger", "--resume", "--out", "{R}/other_run"], "unknown: hovering): start a new"),
    (["train", "tagger", "--resume", "--out", "{R}/bare_run"], "no recorded options"),
    (["train", "tagger", "--compare", "--resume"], "--compare cannot be combined with --resume"),
    (["train", "seq2seq", "--label-smoothing", "1"], "--label-smoothing must be in [0, 1)"),
    (["train", "seq2seq", "--alpha", "-1"], "--alpha must be >= 0"),
    (["train", "seq2seq", "--average-last", "0"], "--average-last must be >= 1, got 0"),
    (["train", "seq2seq", "--ema", "1"], "--ema must be in [0, 1), got 1.0"),
    (["train", "seq2seq", "--verbose", "7"], "'7'"),
    (["train", "seq2seq", "--train-source", "{R}/src.txt"], "must be given together"),
    (
        ["train", "seq2seq", "--train-source", "{R}/empty_dir", "--train-target", "{R}/src.txt"],
        "data file is a directory: {R}/empty_dir",
    ),
    (["train", "seq2seq", "--resume", "--out", "{R}/sagan_run"], "'sagan' run"),
    (["train", "seq2seq", "--out", "{R}/existing.png/run"], "{R}/existing.png is not a directory"),
    (["train", "sagan", "--beta1", "1"], "--beta1 must be in [0, 1), got 1.0"),
    (["train", "sagan", "--ema", "2"], "--ema must be in [0, 1), got 2.0"),
    (["train", "sagan", "--max-images", "2"], "--max-images must be >= 4, got 2"),
    (["train", "sagan", "--n-dis", "0"], "--n-dis must be >= 1, got 0"),
    (["train", "sagan", "--lr-d", "0"], "--lr-d must be > 0"),
    (["train", "sagan", "--image-dir", "{R}/images_file"], "{R}/images_file"),
    (["train", "sagan", "--resume", "--out", "{R}/seq_run"], "'seq2seq' run, not 'sagan'"),
    (["train", "sagan", "--out", "{R}/existing.png"], "--out exists and is not a directory"),
    (["export", "check", "{R}/empty.tflite"], "TFL3"),
    (["export", "check", "{R}/dir.tflite"], "{R}/dir.tflite"),
    (["export", "verify", "{R}/tagger_run", "--samples", "0"], "got 0"),
    (["export", "bench", "{R}/garbage.tflite", "--runs", "0"], "got 0"),
    (
        ["export", "tflite", "{R}/tagger_run", "--out", "{R}/t.tflite", "--tolerance", "-1"],
        "must be >= 0",
    ),
    (
        ["export", "tflite", "{R}/tagger_run", "--out", "{R}/t.tflite", "--min-agreement", "2"],
        "[0, 1]",
    ),
]


def _module(argv):
    return {"train": "train", "export": "export"}[argv[0]], argv[1:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,needle", FAST, ids=[" ".join(a[:3]) + f" #{i}" for i, (a, _) in enumerate(FAST)]
)
def test_cli_bad_input_before_tensorflow(sandbox, argv, needle):
    module, rest = _module(argv)
    before = snapshot(sandbox)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", module, *_expand(rest, sandbox)],
        cwd=sandbox,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check_output(proc.returncode, proc.stderr, _expand([needle], sandbox)[0])
    assert snapshot(sandbox) == before


# ---------------------------------------------------------------------------
# CLI cases that need TensorFlow (data readers that tokenize, model files): in-process.

SLOW = [
    (
        ["train", "seq2seq", "--train-source", "{R}/src.txt", "--train-target", "{R}/tgt.txt"],
        "mismatched line counts: {R}/src.txt has 2 lines, {R}/tgt.txt has 1",
    ),
    (
        ["train", "seq2seq", "--train-source", "{R}/latin1.txt", "--train-target", "{R}/src.txt"],
        "{R}/latin1.txt is not UTF-8",
    ),
    (
        ["train", "seq2seq", "--train-source", "{R}/empty.txt", "--train-target", "{R}/empty.txt"],
        "{R}/empty.txt",
    ),
    (
        [
            "train",
            "seq2seq",
            "--train-source",
            "{R}/blank_line.txt",
            "--train-target",
            "{R}/three.txt",
        ],
        "empty line 2 in {R}/blank_line.txt",
    ),
    (["train", "seq2seq", "--train-tsv", "{R}/pairs.tsv"], "line 2 of {R}/pairs.tsv"),
    # --resume takes --epochs and --verbose; a flag that changes another recorded option
    # (--batch-size; --seed 0 is the recorded seed) is refused, not dropped.
    (
        ["train", "tagger", "--resume", "--out", "{R}/resumable_run", "--batch-size", "16"]
        + ["--seed", "0", "--epochs", "50"],
        "continues {R}/resumable_run with its recorded options: --batch-size would change them",
    ),
    (["train", "tagger", "--model-option", "bogus=1"], "'bogus=1'"),
    (
        ["export", "savedmodel", "{R}/truncated_run", "--out", "{R}/sm"],
        "{R}/truncated_run/model.keras",
    ),
    (["export", "savedmodel", "{R}/flipped_run", "--out", "{R}/sm"], "checksum"),
    (["export", "tflite", "{R}/text_run", "--out", "{R}/t.tflite"], "not a zip archive"),
    (["export", "savedmodel", "{R}/lambda_run", "--out", "{R}/sm"], "Lambda"),
    (["export", "savedmodel", "{R}/hover_run", "--out", "{R}/sm"], "hovercraft"),
    (["export", "savedmodel", "{R}/not_a_run", "--out", "{R}/sm"], "not a run directory"),
    (["export", "savedmodel", "{R}/tagger_run", "--out", "{R}/existing.png"], "{R}/existing.png"),
    (["export", "bench", "{R}/garbage.tflite"], "TFL3"),
    (["zoo.tag", "{R}/tagger_run", "I saw a saw", "   "], "sentence 2 is empty"),
    (["zoo.tag", "{R}/tagger_run", "caf\udce9 au lait"], "not valid UTF-8"),
    (["zoo.tag", "{R}/tagger_run", " ".join(["saw"] * 17)], "17 tokens, more than max_len=16"),
    (["zoo.tag", "{R}/sagan_run", "I saw"], "'sagan' run"),
    (["zoo.tag", "{R}/truncated_run", "I saw"], "truncated"),
    (["zoo.tag", "{R}/lambda_run", "I saw"], "Lambda"),
    (["zoo.tag", "{R}/garbage.tflite", "I saw"], "TFL3"),
    (["zoo.tag", "{R}/missing.tflite", "I saw"], "{R}/missing.tflite"),
    (["zoo.tag", "{R}/tagger_run"], "sentences"),
    (["zoo.translate", "{R}/tagger_run", "hello"], "'tagger' run"),
    (["zoo.translate", "{R}/missing", "hello"], "{R}/missing"),
    (["zoo.translate", "{R}/tagger_run", "hello", "--beam-width", "0"], "got 0"),
    (["zoo.translate", "{R}/tagger_run", ""], "input 1 is empty"),
    (["zoo.translate", "{R}/tagger_run", "ol\udce1"], "not valid UTF-8"),
    (["zoo.translate", "{R}/truncated_run/model.keras", "hello"], "truncated"),
    (["zoo.generate", "{R}/tagger_run", "--out", "{R}/g.png"], "'tagger' run"),
    (["zoo.generate", "{R}/sagan_run", "--out", "{R}/existing.png"], "{R}/existing.png"),
    (["zoo.generate", "{R}/sagan_run", "--out", "{R}/g.png", "--num", "0"], "got 0"),
    (["zoo.generate", "{R}/sagan_run", "--out", "{R}/g.txt"], "{R}/g.txt"),
    (["zoo.generate", "{R}/garbage2.tflite", "--out", "{R}/g.png"], "TFL3"),
    # Reliability II (#23)
    (["train", "seq2seq", "--train-tsv", "{R}/latin1.tsv"], "{R}/latin1.tsv is not UTF-8"),
    (["train", "seq2seq", "--train-tsv", "{R}/empty.txt"], "{R}/empty.txt"),
    (
        [
            "train",
            "seq2seq",
            "--train-source",
            "{R}/truncated.txt.gz",
            "--train-target",
            "{R}/truncated.txt.gz",
        ],
        "cannot read {R}/truncated.txt.gz",
    ),
    (
        ["train", "seq2seq", "--num-heads", "3", "--hidden-dim", "16", "--train-size", "300"],
        "--num-heads 3 must divide --hidden-dim 16",
    ),
    (
        ["export", "savedmodel", "{R}/emptycfg_run", "--out", "{R}/sm"],
        "unreadable {R}/emptycfg_run/config.json",
    ),
    (
        ["export", "savedmodel", "{R}/truncfg_run", "--out", "{R}/sm"],
        "unreadable {R}/truncfg_run/config.json",
    ),
    (
        ["export", "savedmodel", "{R}/latincfg_run", "--out", "{R}/sm"],
        "unreadable {R}/latincfg_run/config.json",
    ),
    (["export", "savedmodel", "{R}/listcfg_run", "--out", "{R}/sm"], 'has no "kind"'),
    (
        ["export", "savedmodel", "{R}/tagger_run", "--out", "{R}/existing.png/sm"],
        "{R}/existing.png is not a directory",
    ),
    (
        ["export", "tflite", "{R}/tagger_run", "--out", "{R}/existing.png/t.tflite"],
        "{R}/existing.png is not a directory",
    ),
    (["export", "tflite", "{R}/tagger_run", "--out", "{R}/t.txt"], "--out must end in .tflite"),
    (["export", "tflite", "{R}/tagger_run", "--out", "{R}/dir.tflite"], "--out is a directory"),
    (
        ["export", "tflite", "{R}/src.txt", "--out", "{R}/t.tflite"],
        "not a run directory or .keras model file",
    ),
    (["export", "tflite", "{R}/empty_dir", "--out", "{R}/t.tflite"], "not a run directory"),
    (
        ["export", "tflite", "{R}/tagger_run", "--out", "{R}/t.tflite", "--length", "4"],
        "--length only applies",
    ),
    (
        ["export", "verify", "{R}/tagger_run", "--tflite", "{R}/missing.tflite"],
        "{R}/missing.tflite",
    ),
    (["export", "verify", "{R}/tagger_run"], "--savedmodel and/or --tflite"),
    (["export", "bench", "{R}/empty.tflite"], "TFL3"),
    (["export", "bench", "{R}/missing.tflite"], "{R}/missing.tflite"),
    (["zoo.tag", "{R}/empty_dir", "I saw"], "{R}/empty_dir"),
    (["zoo.tag", "{R}/emptycfg_run", "I saw"], "unreadable {R}/emptycfg_run/config.json"),
    (["zoo.tag", "{R}/truncfg_run", "I saw"], "unreadable {R}/truncfg_run/config.json"),
    (["zoo.tag", "{R}/latin1side.tflite", "I saw"], "unreadable sidecar file"),
    (["zoo.tag", "{R}/empty.tflite", "I saw"], "missing sidecar"),
    (["zoo.tag", "{R}/src.txt", "I saw"], "{R}/src.txt"),
    (["zoo.translate", "{R}/sagan_run", "hello"], "'sagan' run"),
    (["zoo.translate", "{R}/empty_dir", "hello"], "{R}/empty_dir/model.keras"),
    (["zoo.translate", "{R}/seq_run", "hello", "--alpha", "-1"], "--alpha must be >= 0"),
    (["zoo.generate", "{R}/seq_run", "--out", "{R}/g.png"], "'seq2seq' run, not 'sagan'"),
    (
        ["zoo.generate", "{R}/sagan_run", "--out", "{R}/existing.png/g.png"],
        "{R}/existing.png is not a directory",
    ),
    (["zoo.generate", "{R}/sagan_run", "--out", "{R}/empty_dir"], "{R}/empty_dir"),
    (["zoo.generate", "{R}/sagan_run", "--out", "{R}/g.png", "--columns", "0"], "got 16 and 0"),
    (["zoo.generate", "{R}/empty_dir", "--out", "{R}/g.png"], "{R}/empty_dir"),
    (["zoo.generate", "{R}/empty.tflite", "--out", "{R}/g.png"], "missing sidecar"),
]


def _main(name):
    import importlib

    if name == "train":
        return importlib.import_module("train.cli").main
    if name == "export":
        return importlib.import_module("export.__main__").main
    return importlib.import_module(name).main


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,needle", SLOW, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(SLOW)]
)
def test_cli_bad_input_in_process(sandbox, argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(sandbox)
    before = snapshot(sandbox)
    rc = _main(argv[0])(_expand(argv[1:], sandbox))
    err = capsys.readouterr().err
    _check_output(rc, err, _expand([needle], sandbox)[0])
    assert snapshot(sandbox) == before
    assert not os.path.exists(os.path.join(sandbox, "PWNED"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,needle",
    [
        (["zoo.tag", "{R}/lambda_run", "I saw"], "Lambda"),
        (["export", "bench", "{R}/garbage.tflite"], "TFL3"),
    ],
)
def test_cli_bad_input_real_process_after_tensorflow_import(sandbox, argv, needle):
    """The C++ runtimes' start-up lines must not reach stderr either."""
    module, rest = (argv[0], argv[1:]) if argv[0].startswith("zoo") else _module(argv)
    before = snapshot(sandbox)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the CLIs set it themselves
    proc = subprocess.run(
        [sys.executable, "-m", module, *_expand(rest, sandbox)],
        cwd=sandbox,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _check_output(proc.returncode, proc.stderr, needle)
    assert snapshot(sandbox) == before
    assert not os.path.exists(os.path.join(sandbox, "PWNED"))


# ---------------------------------------------------------------------------
# Permissions: unreadable inputs, directories that cannot be written. Root reads and
# writes through file modes, so these run for other users only.


@pytest.fixture
def locked_down(tmp_path):
    unreadable = tmp_path / "unreadable.conllu"
    unreadable.write_bytes(open(os.path.join(FIXTURES, "small.conllu"), "rb").read())
    unreadable_tsv = tmp_path / "unreadable.tsv"
    unreadable_tsv.write_text("a\tb\n" * 200)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    for path, mode in ((unreadable, 0o000), (unreadable_tsv, 0o000), (read_only, 0o555)):
        os.chmod(path, mode)
    yield str(tmp_path)
    for path, mode in ((unreadable, 0o644), (unreadable_tsv, 0o644), (read_only, 0o755)):
        os.chmod(path, mode)


PERMISSIONS = [
    (
        ["train", "tagger", "--train-file", "{P}/unreadable.conllu"],
        "cannot read {P}/unreadable.conllu",
    ),
    (["train", "seq2seq", "--train-tsv", "{P}/unreadable.tsv"], "cannot read {P}/unreadable.tsv"),
    (["train", "tagger", "--out", "{P}/ro/run"], "{P}/ro is not writable"),
    (["train", "sagan", "--out", "{P}/ro"], "--out is not writable: {P}/ro"),
    (["export", "tflite", "{R}/tagger_run", "--out", "{P}/ro/t.tflite"], "{P}/ro is not writable"),
    (["export", "savedmodel", "{R}/tagger_run", "--out", "{P}/ro/sm"], "{P}/ro is not writable"),
    (["zoo.generate", "{R}/sagan_run", "--out", "{P}/ro/g.png"], "{P}/ro is not writable"),
]


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root reads and writes regardless of file modes",
)
@pytest.mark.parametrize(
    "argv,needle",
    PERMISSIONS,
    ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(PERMISSIONS)],
)
def test_cli_permission_denied(sandbox, locked_down, argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(sandbox)
    expand = lambda items: [a.replace("{P}", locked_down) for a in _expand(items, sandbox)]  # noqa: E731
    listing = lambda: sorted(
        (p, os.stat(os.path.join(d, p)).st_mtime_ns)  # noqa: E731
        for d, _, files in os.walk(locked_down)
        for p in files + [""]
    )
    before = snapshot(sandbox), listing()
    rc = _main(argv[0])(expand(argv[1:]))
    _check_output(rc, capsys.readouterr().err, expand([needle])[0])
    assert (snapshot(sandbox), listing()) == before


# ---------------------------------------------------------------------------
# Unexpected errors: exit 1, a short message, the traceback only under --debug.


@pytest.mark.parametrize("cli", ["train", "export", "zoo.tag"])
def test_unexpected_error_exit_1_traceback_only_with_debug(sandbox, cli, capsys, monkeypatch):
    monkeypatch.chdir(sandbox)

    def boom(*args, **kwargs):
        raise RuntimeError("internal boom\nsecond line")

    if cli == "train":
        import train.tagger

        monkeypatch.setattr(train.tagger, "run", boom)
        argv = ["tagger"]
    elif cli == "export":
        import export.__main__

        monkeypatch.setattr(export.__main__, "_run", boom)
        argv = ["check", "x.tflite"]
    else:
        import zoo.tag

        monkeypatch.setattr(zoo.tag, "load_for_command", boom)
        argv = [os.path.join(sandbox, "tagger_run"), "I saw"]
    rc = _main(cli)(argv)
    err = capsys.readouterr().err
    _check_output(rc, err, "RuntimeError: internal boom", code=1)
    assert "--debug" in err
    try:
        rc = _main(cli)(argv + ["--debug"])
    except RuntimeError:
        rc = "raised"  # export/tag re-raise under --debug: Python prints the traceback
    err = capsys.readouterr().err
    assert rc == "raised" or ("Traceback" in err and rc == 1), (rc, err)


# ---------------------------------------------------------------------------
# Safe loading.


def test_lambda_model_is_refused_under_safe_mode_and_runs_nothing(sandbox, tmp_path):
    from zoo import model_file

    path = os.path.join(sandbox, "lambda_run", "model.keras")
    marker = os.path.join(sandbox, "PWNED")
    with pytest.raises(model_file.ModelFileError, match="Lambda"):
        model_file.load(path)
    assert not os.path.exists(marker)
    # Control: the same file does run its code when safe_mode is off, so the check above
    # can fail. A copy with its own marker, so the sandbox stays clean.
    import keras

    own_marker = str(tmp_path / "ran")
    _lambda_model(str(tmp_path / "m.keras"), own_marker)
    keras.models.load_model(str(tmp_path / "m.keras"), safe_mode=False)
    assert os.path.exists(own_marker)


@pytest.mark.parametrize(
    "run,needle",
    [
        ("truncated_run", "not a zip archive"),
        ("flipped_run", "fails its checksum"),
        ("text_run", "not a zip archive"),
        ("hover_run", "not a zip archive"),
    ],
)
def test_damaged_model_files_raise_model_file_error(sandbox, run, needle):
    from zoo import model_file

    with pytest.raises(model_file.ModelFileError, match=needle):
        model_file.load(os.path.join(sandbox, run, "model.keras"))


def test_model_file_of_the_wrong_class(sandbox):
    from zoo.cli import UsageError
    from zoo.tasks import load_for_command

    path = os.path.join(sandbox, "tagger_run", "model.keras")
    with pytest.raises(UsageError, match="holds a tagger model, not a seq2seq one"):
        load_for_command(path, "seq2seq")()


# ---------------------------------------------------------------------------
# Python API: ValueError/TypeError naming the argument and the value.


def _x(b=2, t=5, d=8):
    return np.random.default_rng(0).random((b, t, d)).astype("float32")


def _api_cases():
    import layers as L
    import zoo.models  # noqa: F401  (registers every class zoo model files name)

    small = dict(words=["<pad>", "<unk>", "a"], chars=["<pad>", "<unk>", "a"], tags=["X"])
    mha = lambda **kw: L.MultiHeadAttention(2, 4, **kw)  # noqa: E731
    return [
        ("num_heads=0", lambda: L.MultiHeadAttention(0, 4), "num_heads=0"),
        ("key_dim=2.5", lambda: L.MultiHeadAttention(2, 2.5), "key_dim=2.5"),
        ("score", lambda: mha(score="cosine"), "score='cosine'"),
        ("normalize", lambda: L.SelfAttention(4, normalize="sparsemax"), "normalize='sparsemax'"),
        ("dropout", lambda: mha(dropout=1.5), "dropout=1.5"),
        ("window", lambda: mha(window=-2), "window=-2"),
        ("rotary odd", lambda: L.MultiHeadAttention(2, 3, rotary=True), "key_dim=3"),
        ("units", lambda: L.SelfAttention(0), "units=0"),
        ("intermediate_dim", lambda: L.TransformerEncoderBlock(2, 0), "intermediate_dim=0"),
        (
            "activation",
            lambda: L.TransformerEncoderBlock(2, 8, activation="swishy"),
            "activation='swishy'",
        ),
        (
            "layer_norm_epsilon",
            lambda: L.TransformerEncoderBlock(2, 8, layer_norm_epsilon=-1),
            "layer_norm_epsilon=-1",
        ),
        ("heads divide", lambda: L.TransformerEncoderBlock(3, 8)(_x()), "num_heads=3"),
        ("query rank", lambda: mha()(_x()[0]), "query.shape=(5, 8)"),
        ("inputs rank", lambda: L.SelfAttention(4)(_x()[0]), "inputs.shape=(5, 8)"),
        (
            "attention_mask rank 2",
            lambda: mha()(_x(), attention_mask=np.ones((5, 5), bool)),
            "attention_mask.shape=(5, 5)",
        ),
        (
            "attention_mask keys",
            lambda: mha()(_x(), attention_mask=np.ones((2, 5, 4), bool)),
            "attention_mask.shape=(2, 5, 4)",
        ),
        (
            "attention_mask batch",
            lambda: mha()(_x(), attention_mask=np.ones((3, 5, 5), bool)),
            "attention_mask.shape=(3, 5, 5)",
        ),
        ("query/value batch", lambda: mha()(_x(), value=_x(b=3)), "value.shape=(3, 5, 8)"),
        (
            "query_mask",
            lambda: mha()(_x(), query_mask=np.ones((2, 4), bool)),
            "query_mask.shape=(2, 4)",
        ),
        (
            "value_mask",
            lambda: mha()(_x(), value=_x(t=6), value_mask=np.ones((2, 5), bool)),
            "value_mask.shape=(2, 5)",
        ),
        (
            "features after build",
            lambda: (lambda layer: (layer(_x()), layer(_x(d=6))))(mha()),
            "query.shape=(2, 5, 6)",
        ),
        (
            "cache heads",
            lambda: mha()(_x()[:, :1], cache=np.zeros((2, 2, 5, 3, 4), "float32"), cache_index=0),
            "cache.shape=(2, 2, 5, 3, 4)",
        ),
        (
            "cache rank",
            lambda: mha()(_x()[:, :1], cache=np.zeros((2, 5, 2, 4), "float32"), cache_index=0),
            "cache.shape=(2, 5, 2, 4)",
        ),
        (
            "cache batch",
            lambda: mha()(_x()[:, :1], cache=np.zeros((3, 2, 5, 2, 4), "float32"), cache_index=0),
            "cache.shape=(3, 2, 5, 2, 4)",
        ),
        (
            "cache_index range",
            lambda: mha()(_x()[:, :1], cache=np.zeros((2, 2, 5, 2, 4), "float32"), cache_index=5),
            "cache_index=5",
        ),
        ("cache_index alone", lambda: mha()(_x(), cache_index=0), "cache_index=0"),
        (
            "self mask",
            lambda: L.SelfAttention(4)(_x(), mask=np.ones((2, 3), bool)),
            "mask.shape=(2, 3)",
        ),
        (
            "self attention_mask",
            lambda: L.SelfAttention(4)(_x(), attention_mask=np.ones((2, 5, 3), bool)),
            "attention_mask.shape=(2, 5, 3)",
        ),
        (
            "encoder attention_mask",
            lambda: L.TransformerEncoderBlock(2, 8)(_x(), attention_mask=np.ones((2, 4, 5), bool)),
            "attention_mask.shape=(2, 4, 5)",
        ),
        (
            "decoder encoder batch",
            lambda: L.TransformerDecoderBlock(2, 8)(_x(), encoder_outputs=_x(b=3)),
            "shape=(3, 5, 8)",
        ),
        ("position range", lambda: L.PositionEmbedding(3)(_x()), "length 5"),
        ("zoo name", lambda: zoo.build("transformer-xl"), "'transformer-xl'"),
        ("zoo arch", lambda: zoo.build("tagger", arch="lstm", **small), "arch='lstm'"),
        ("zoo hidden_dim", lambda: zoo.build("tagger", hidden_dim=-1, **small), "hidden_dim=-1"),
        ("zoo max_len", lambda: zoo.build("tagger", max_len=0, **small), "max_len=0"),
        ("zoo tags", lambda: zoo.build("tagger", **{**small, "tags": []}), "tags=[]"),
        ("zoo unknown kwarg", lambda: zoo.build("tagger", bogus=1, **small), "bogus"),
        ("zoo sagan size", lambda: zoo.build("sagan_generator", image_size=33), "image_size=33"),
    ]


_API_IDS = [
    "num_heads=0",
    "key_dim=2.5",
    "score",
    "normalize",
    "dropout",
    "window",
    "rotary odd",
    "units",
    "intermediate_dim",
    "activation",
    "layer_norm_epsilon",
    "heads divide",
    "query rank",
    "inputs rank",
    "attention_mask rank 2",
    "attention_mask keys",
    "attention_mask batch",
    "query/value batch",
    "query_mask",
    "value_mask",
    "features after build",
    "cache heads",
    "cache rank",
    "cache batch",
    "cache_index range",
    "cache_index alone",
    "self mask",
    "self attention_mask",
    "encoder attention_mask",
    "decoder encoder batch",
    "position range",
    "zoo name",
    "zoo arch",
    "zoo hidden_dim",
    "zoo max_len",
    "zoo tags",
    "zoo unknown kwarg",
    "zoo sagan size",
]


@pytest.mark.slow
@pytest.mark.parametrize("case", _API_IDS)
def test_api_bad_argument_names_the_value(case):
    cases = {name: (fn, needle) for name, fn, needle in _api_cases()}
    fn, needle = cases[case]
    with pytest.raises((ValueError, TypeError)) as info:
        fn()
    assert needle in str(info.value), str(info.value)


def test_api_case_table_is_complete():
    assert sorted(name for name, _, _ in _api_cases()) == sorted(_API_IDS)


def test_attention_mask_broadcast_over_batch_is_allowed():
    """A [1, Tq, Tk] mask is the documented broadcast; it must equal the tiled mask."""
    import layers as L

    layer = L.MultiHeadAttention(2, 4)
    rng = np.random.default_rng(1)
    mask = rng.random((1, 5, 5)) > 0.3
    one = np.asarray(layer(_x(), attention_mask=mask))
    tiled = np.asarray(layer(_x(), attention_mask=np.repeat(mask, 2, axis=0)))
    np.testing.assert_allclose(one, tiled, atol=1e-6)
