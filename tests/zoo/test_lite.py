"""`zoo.lite`: the TFLite exports run with ai-edge-litert, NumPy and sentencepiece
only, in a process where importing TensorFlow, Keras or tensorflow_text fails,
and answer what the Keras models answer in this process: the same tags, the same
greedy and beam-search tokens, images equal up to float rounding (#17)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zoo
import zoo.models  # noqa: F401
from export.kinds import seq2seq as seq2seq_kind
from export.tflite import export_tflite
from tests.export.test_stock_serving import text_seq2seq_model
from tests.support.runs import make_tagger_run, run_clean
from zoo.seq2seq import decoding

pytestmark = pytest.mark.slow  # seconds per test: make test-fast leaves the file out

TEXTS = ["a man in the snow", "deux chiens jouent", "ｆｕｌｌｗｉｄｔｈ dogs", "x"]
WORDS = ["I saw a saw", "the dog can book a cat 42", "They SAW 7 Dogs"]

_CHILD = r"""
import importlib.abc, json, sys

BLOCKED = ("tensorflow", "keras", "tensorflow_text", "tf_keras", "jax")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: zoo.lite must not need it")

sys.meta_path.insert(0, Block())
for name in BLOCKED:
    try:
        __import__(name)
        raise SystemExit(f"the block of {name} failed")
    except ImportError:
        pass
import zoo.lite
import zoo.litert

paths, sentences, texts = json.loads(sys.argv[1])
out = {}
tagger = zoo.lite.load(paths["tagger"])
out["tags"] = tagger.tag(sentences)
for key in ("steps_dir", "steps_file", "greedy_file"):
    translator = zoo.lite.load(paths[key])
    out[key] = {"greedy": [translator.translate(text) for text in texts]}
    if key != "greedy_file":
        out[key]["beam"] = [translator.translate(text, beam_width=3) for text in texts]
# The one decoder of the step signatures (zoo.litert.StepModel), on ids.
from zoo.seq2seq.tokenization import Tokenizer
steps = zoo.litert.StepModel.from_interpreter(zoo.litert.interpreter(paths["steps_file"]))
with open(paths["spm"], "rb") as f:
    ids = Tokenizer(f.read()).encode(texts)
from zoo.seq2seq.samplers import Beam, Greedy
out["ids"] = [steps.generate_ids([row], Greedy())[0][0][0] for row in ids]
out["beam_ids"] = [steps.generate_ids([row], Beam(3))[0][0][0] for row in ids]
generator = zoo.lite.load(paths["sagan"])
out["images"] = generator.generate([0, 2, 1], seed=7).tolist()
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "keras", "tensorflow_text",
                                                          "layers", "export", "train"})
assert not loaded, loaded
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    import keras

    base = tmp_path_factory.mktemp("lite")
    keras.utils.set_random_seed(1)
    run = str(base / "tagger-run")
    make_tagger_run(run)
    export_tflite(run, str(base / "tagger.tflite"))
    translator = text_seq2seq_model()
    keras_file = str(base / "s2s.keras")
    translator.save(keras_file)
    seq2seq_kind.export_all(keras_file, str(base / "s2s"))
    generator = zoo.build(
        "sagan_generator", image_size=32, channels=1, num_classes=3, latent_dim=8, width=4
    )
    export_tflite(generator, str(base / "sagan.tflite"))
    paths = {
        "tagger": str(base / "tagger.tflite"),
        "steps_dir": str(base / "s2s"),
        "steps_file": str(base / "s2s" / "steps.tflite"),
        "greedy_file": str(base / "s2s" / "greedy.tflite"),
        "sagan": str(base / "sagan.tflite"),
        "spm": str(base / "s2s" / "spm.model"),
    }
    result = run_clean(_CHILD, json.dumps([paths, WORDS, TEXTS]))
    assert result.returncode == 0, result.stderr[-3000:]
    return {
        "run": run,
        "translator": translator,
        "keras_file": keras_file,
        "generator": generator,
        "dir": str(base),
        "got": json.loads(result.stdout.strip().splitlines()[-1]),
        "paths": json.dumps(paths),
        "paths_words_texts": json.dumps([paths, WORDS, TEXTS]),
        "keras_batch": translator.translate(TEXTS),
    }


def test_export_folder_ships_the_sentencepiece_model(exports):
    with open(os.path.join(exports["dir"], "s2s", "spm.model"), "rb") as f:
        assert f.read() == exports["translator"].tokenizer.proto


def test_tags_equal_keras(exports):
    want = zoo.load(exports["run"]).tag(WORDS)
    assert [[list(pair) for pair in row] for row in want] == exports["got"]["tags"]


def test_greedy_and_beam_equal_keras(exports):
    model = exports["translator"]
    ids = model.tokenizer.encode(TEXTS)
    greedy = [model.translate([text])[0] for text in TEXTS]
    greedy_ids = [decoding.decode_ids(model, [row])[0] for row in ids]
    beam = [model.translate([text], beam_width=3)[0] for text in TEXTS]
    beam_ids = [decoding.decode_ids(model, [row], beam_width=3)[0] for row in ids]
    assert any(len(row) > 2 for row in greedy_ids)  # not a vacuous comparison
    assert greedy_ids != beam_ids or greedy == beam
    assert exports["got"]["ids"] == greedy_ids
    assert exports["got"]["beam_ids"] == beam_ids
    for key in ("steps_dir", "steps_file", "greedy_file"):
        assert exports["got"][key]["greedy"] == greedy, key
    for key in ("steps_dir", "steps_file"):
        assert exports["got"][key]["beam"] == beam, key


def test_generated_images_equal_keras(exports):
    generator = exports["generator"]
    labels = np.array([0, 2, 1], np.int32)
    noise = np.random.default_rng(7).standard_normal((3, 8)).astype(np.float32)
    want = np.clip(
        np.asarray(generator({"noise": noise, "label": labels}, training=False)) * 0.5 + 0.5, 0, 1
    )
    got = np.asarray(exports["got"]["images"], np.float32)
    assert got.shape == want.shape and want.std() > 0
    np.testing.assert_allclose(got, want, atol=1e-4)


# ---------------------------------------------------------------- the lite install
def _installed_closure(requires):
    """The distributions installed here that `requires` (Requires-Dist lines) needs,
    transitively, by their metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement

    found, todo = {}, list(requires)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dist = metadata.distribution(req.name)
        assert dist.version in req.specifier, (req, dist.version)
        if dist.metadata["Name"].lower() not in found:
            found[dist.metadata["Name"].lower()] = dist
            todo += dist.requires or []
    return list(found.values())


def _link_installed(dists, site):
    """Makes `dists` (installed here) installed in the venv whose site-packages is
    `site`, offline: symlinks to their files, a whole directory where no other
    installed distribution has files in it (a shared namespace such as `google/` is
    linked entry by entry)."""
    from importlib import metadata

    owners = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"].lower()
        for f in dist.files or []:
            for depth in range(1, len(f.parts)):
                owners.setdefault(f.parts[:depth], set()).add(name)
    for dist in dists:
        name, here = dist.metadata["Name"].lower(), str(dist.locate_file(""))
        for f in dist.files or []:
            if f.parts[0] == "..":
                continue  # console scripts in bin/
            depth = next(
                (d for d in range(1, len(f.parts)) if owners.get(f.parts[:d]) == {name}),
                len(f.parts),
            )
            target = os.path.join(site, *f.parts[:depth])
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(os.path.join(here, *f.parts[:depth]), target)


def _run(python, *args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TF_", "KERAS"))}
    return subprocess.run(
        [python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_lite_install_runs_the_three_kinds_without_tensorflow(exports, tmp_path):
    """README's client install, offline: `pip install ./lite` into a fresh venv whose
    only other distributions are the ones attention-zoo-lite's metadata asks for
    (linked from this venv; no package index), then the three CLIs and zoo.lite on
    the exports: the answers of the Keras models (checked above), nothing on stderr,
    and no TensorFlow to import."""
    import email
    import shutil
    import zipfile

    from tests.support.paths import ROOT

    # A copy of lite/ and zoo/ side by side: the build writes build/ and egg-info there.
    source = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "lite"), source / "lite")
    shutil.copytree(
        os.path.join(ROOT, "zoo"), source / "zoo", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    done = _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                wheels, source / "lite", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    wheel = next(wheels.glob("attention_zoo_lite-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(next(n for n in names if n.endswith("METADATA"))))
    assert "zoo/lite.py" in names and "zoo/seq2seq/samplers.py" in names
    assert not [n for n in names if n.startswith(("layers/", "train/", "export/"))]
    dists = _installed_closure(meta.get_all("Requires-Dist"))
    installed = {d.metadata["Name"].lower() for d in dists}
    assert {"ai-edge-litert", "numpy", "sentencepiece", "pillow"} <= installed
    assert not installed & {"tensorflow", "tensorflow-cpu", "keras", "jax", "tensorflow-text"}

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                cwd=tmp_path).stdout.strip()  # fmt: skip
    _link_installed(dists, site)
    # The documented command, with the wheel instead of the index.
    done = _run(*pip, "--python", python, "install", "--no-index", "--find-links", wheels,
                "attention-zoo-lite", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tensorflow" in _run(python, "-c", "import tensorflow", cwd=tmp_path).stderr

    paths = json.loads(exports["paths"])
    got = exports["got"]
    tag = _run(python, "-m", "zoo.tag", paths["tagger"], *WORDS, cwd=tmp_path)
    assert (tag.returncode, tag.stderr) == (0, ""), tag.stderr
    assert tag.stdout.splitlines() == [" ".join(f"{w}/{t}" for w, t in row) for row in got["tags"]]
    translate = _run(python, "-m", "zoo.translate", paths["steps_dir"], *TEXTS, cwd=tmp_path)
    assert (translate.returncode, translate.stderr) == (0, ""), translate.stderr
    assert translate.stdout.splitlines() == exports["keras_batch"]
    generate = _run(python, "-m", "zoo.generate", paths["sagan"], "--out", "grid.png",
                    "--num", "2", cwd=tmp_path)  # fmt: skip
    assert (generate.returncode, generate.stderr) == (0, ""), generate.stderr
    assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    library = _run(python, "-c", _CHILD, exports["paths_words_texts"], cwd=tmp_path)
    assert library.returncode == 0, library.stderr
    assert json.loads(library.stdout.strip().splitlines()[-1]) == got


# ---------------------------------------------------------------- quiet command lines
def _command(module, *args, cwd, importtime=False):
    """`python -m module args` as a user runs it: no TF_CPP_MIN_LOG_LEVEL, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH")}
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run(
        [sys.executable, *flags, "-m", module, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_zoo_commands_on_exports_import_no_tensorflow_and_stay_quiet(exports, tmp_path):
    """`python -m zoo.tag|translate|generate` on a .tflite file or an export folder:
    results on stdout, nothing on stderr, and `-X importtime` lists no TensorFlow,
    Keras or JAX module."""
    from tests.support.paths import ROOT

    paths = json.loads(exports["paths"])
    commands = [
        ("zoo.tag", paths["tagger"], *WORDS),
        ("zoo.translate", paths["steps_dir"], *TEXTS),
        ("zoo.translate", paths["greedy_file"], TEXTS[0]),
        ("zoo.generate", paths["sagan"], "--out", tmp_path / "grid.png", "--num", "2"),
    ]
    for module, *args in commands:
        done = _command(module, *args, cwd=ROOT)
        assert (done.returncode, done.stderr) == (0, ""), (module, done.stderr)
        assert done.stdout.strip(), module
        if module == "zoo.generate":
            args = [*args, "--force"]
        loaded = _command(module, *args, cwd=ROOT, importtime=True)
        heavy = [
            line.rsplit("|", 1)[-1].strip()
            for line in loaded.stderr.splitlines()
            if line.startswith("import time:")
            and line.rsplit("|", 1)[-1].strip().split(".")[0] in ("tensorflow", "keras", "jax")
        ]
        assert heavy == [], (module, heavy[:5])


def test_tensorflow_commands_print_no_start_up_lines(exports, tmp_path):
    """A command that imports TensorFlow and runs LiteRT (`export tflite`, `export
    check`, `zoo.tag` on the run): only its result line, nothing on stderr."""
    from tests.support.paths import ROOT

    path = tmp_path / "tagger.tflite"
    for module, *args in (
        ("export", "tflite", exports["run"], "--out", path),
        ("export", "check", path),
        ("zoo.tag", exports["run"], WORDS[0]),
    ):
        done = _command(module, *args, cwd=ROOT)
        assert done.stderr == "", (module, args, done.stderr)
        assert done.stdout.strip() and done.returncode in (0, 1), (module, done.stdout)


# ---------------------------------------------------------------- the served-model contract
# What a user may type (#48): empty, blank, unseen characters, other scripts,
# control characters, emoji; zoo.lite answers what the Keras model answers
# through zoo.load, and what the documented app loop answers.
CONTRACT_TEXTS = [
    "",
    "   ",
    "\t\n ",
    "zzz qqq",
    "你好世界",
    "a\x00b\x07c\x1b",
    "😀🎉 dogs",
    "ｆｕｌｌｗｉｄｔｈ",
    "Ünïcödé ñ ß",
    "\u200b\u200d",
    "x",
]


@pytest.fixture(scope="module")
def contract(exports):
    paths = json.loads(exports["paths"])
    return {
        "paths": paths,
        "tagger": zoo.lite.load(paths["tagger"]),
        "keras_tagger": zoo.load(exports["run"]),
        "translator": zoo.lite.load(paths["steps_dir"]),
        "steps": zoo.litert.StepModel.from_interpreter(zoo.litert.interpreter(paths["steps_file"])),
        "greedy_file": zoo.lite.load(paths["greedy_file"]),
        "keras_translator": zoo.load(exports["keras_file"]),
        "generator": zoo.lite.load(paths["sagan"]),
    }


def test_any_text_translates_as_keras_translates(contract):
    lite, keras_task = contract["translator"], contract["keras_translator"]
    want = keras_task.translate(CONTRACT_TEXTS)
    assert lite.translate(CONTRACT_TEXTS) == want
    assert contract["greedy_file"].translate(CONTRACT_TEXTS) == want
    # Each text alone, a batch of one, the empty batch.
    for text in CONTRACT_TEXTS:
        assert lite.translate(text) == keras_task.translate(text) == lite.translate([text])[0]
    assert lite.translate([]) == keras_task.translate([]) == []
    # No ids: "" without running the model, score 0, in every sampler.
    for text in ("", "   ", "\t\n "):
        assert lite.translate(text) == ""
        assert lite.generate([text], sampler="beam", return_scores=True) == [[("", 0.0)]]
    pairs = lite.generate(["", "x"], sampler="top_k", num_return_sequences=2, seed=1)
    assert pairs[0] == [("", 0.0), ("", 0.0)] and len(pairs[1]) == 2


def test_any_sentence_tags_as_keras_tags(contract):
    lite, keras_task = contract["tagger"], contract["keras_tagger"]
    sentences = CONTRACT_TEXTS + ["I saw a saw", ["I", "saw", "😀"]]
    got = lite.tag(sentences)
    assert got == keras_task.tag(sentences)
    assert got[0] == got[1] == got[2] == [] and len(got[-1]) == 3
    assert lite.tag([]) == keras_task.tag([]) == []
    assert lite.tag("I saw") == keras_task.tag("I saw")


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda c: c["translator"].translate("abc " * 40), "more than the model's 16"),
        (lambda c: c["translator"].translate(["x", 3]), "must be a str or a list of str"),
        (lambda c: c["translator"].translate("a\ud800b"), "input 0 is not valid Unicode"),
        (lambda c: c["translator"].translate("x", max_length=99), "max_target_length (12)"),
        (lambda c: c["tagger"].tag(" ".join(["saw"] * 17)), "17 tokens, more than the model's 16"),
        (lambda c: c["tagger"].tag([["I", ""]]), "sentence 0 has an empty token"),
        (lambda c: c["tagger"].tag([["I", 7]]), "sentence 0 must be a str or a list of str"),
        (lambda c: c["tagger"].tag(["ok", "a\udc80"]), "sentence 1 is not valid Unicode"),
        (lambda c: c["generator"].generate([3], seed=0), "ints in [0, 3)"),
        (lambda c: c["generator"].generate([-1], seed=0), "ints in [0, 3)"),
        (lambda c: c["generator"].generate([True], seed=0), "ints in [0, 3)"),
        (lambda c: c["generator"].generate(["cat"], seed=0), "unknown class"),
        (lambda c: c["generator"].generate([], seed=0), "`class_ids` is empty"),
        (
            lambda c: c["steps"].encode([5, c["steps"].vocabulary_size]),
            "in [0, ",
        ),
        (lambda c: c["steps"].encode([-1]), "in [0, "),
    ],
)
def test_what_zoo_lite_refuses_it_refuses_in_our_words(contract, call, needle):
    with pytest.raises(ValueError) as info:
        call(contract)
    assert needle in str(info.value)


def test_a_batch_of_images_is_its_images_one_by_one(contract):
    generator = contract["generator"]
    batch = generator.generate([0, 2, 1, 0], seed=3)
    noise = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    alone = [generator.images(noise[i : i + 1], np.array([c], np.int32)) for i, c in
             enumerate([0, 2, 1, 0])]  # fmt: skip
    np.testing.assert_allclose(batch, np.concatenate(alone), atol=1e-6)


def _app_translate(paths, text):
    """docs/deploy.md's app loop (the Kotlin / Swift snippets and the rules above
    them), written again with LiteRT's interpreter and SentencePiece alone."""
    import sentencepiece
    from ai_edge_litert.interpreter import Interpreter

    sp = sentencepiece.SentencePieceProcessor(model_file=paths["spm"])
    ids = sp.encode(text)
    if not ids:
        return ""
    interpreter = Interpreter(model_path=paths["steps_file"])
    encode = interpreter.get_signature_runner("encode")
    step = interpreter.get_signature_runner("decode_step")
    s = encode.get_input_details()["source_ids"]["shape"][1]
    cache_shape = step.get_input_details()["self_cache"]["shape"]
    if len(ids) > s:
        raise ValueError(f"the text has {len(ids)} tokens, more than the model's {s}")
    ceil8 = lambda n: max(8, -(-n // 8) * 8)
    limit = min(cache_shape[1], ceil8(2 * ceil8(len(ids)) + 10))
    source = np.zeros((1, s), np.int32)
    source[0, : len(ids)] = ids
    encoded = encode(source_ids=source)
    cache, token, out = np.zeros(cache_shape, np.float32), 2, []
    for position in range(limit):
        result = step(
            token=np.array([token], np.int32),
            position=np.array(position, np.int32),
            cross_cache=encoded["cross_cache"],
            encoder_mask=encoded["encoder_mask"],
            self_cache=cache,
        )
        cache = result["self_cache"]
        token = int(np.argmax(result["logits"][0]))
        if token == 3:
            break
        out.append(token)
    return sp.decode([i for i in out if i > 2])


def test_the_documented_app_loop_answers_what_zoo_lite_answers(contract):
    lite = contract["translator"]
    for text in CONTRACT_TEXTS + ["abc def", "deux chiens jouent"]:
        assert _app_translate(contract["paths"], text) == lite.translate(text), text
    with pytest.raises(ValueError, match="more than the model's 16"):
        _app_translate(contract["paths"], "abc " * 40)


def test_zoo_lite_objects_may_be_shared_between_threads(contract):
    """8 threads calling one object at once get what serial calls get (each object
    serialises its interpreter's calls)."""
    from concurrent.futures import ThreadPoolExecutor

    texts = CONTRACT_TEXTS + ["abc def", "deux chiens jouent", "a man in the snow"]
    jobs = [
        (contract["translator"].translate, [texts[i % len(texts)], texts[(i * 3) % len(texts)]])
        for i in range(16)
    ]
    jobs += [(contract["tagger"].tag, [WORDS[i % 3], CONTRACT_TEXTS[i % 5]]) for i in range(16)]
    jobs += [(lambda ids: contract["generator"].generate(ids, seed=1).tolist(), [i % 3, 1])
             for i in range(8)]  # fmt: skip
    serial = [fn(arg) for fn, arg in jobs]
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(lambda job: job[0](job[1]), jobs)) == serial


# ---------------------------------------------------------------- property tests
# Arbitrary Unicode text and batch shapes: zoo.lite answers what the Keras model
# answers through zoo.load, or both refuse with a ValueError. `make test` runs the
# default profile's share, `make fuzz` (HYPOTHESIS_PROFILE=fuzz) many more.
_PROFILE = settings.default.max_examples
_LITE_SETTINGS = settings(
    max_examples=max(10, _PROFILE // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# Any character, the vocabulary's letters (so words are found) and the edge ones.
_CHARS = st.one_of(st.characters(), st.sampled_from(list("Isawthe dogcanbook 0\x00\t")))


def _both(lite_call, keras_call):
    try:
        want = ("ok", keras_call())
    except ValueError:
        want = ("refused", None)
    try:
        got = ("ok", lite_call())
    except ValueError:
        got = ("refused", None)
    return got, want


@_LITE_SETTINGS
@given(texts=st.lists(st.text(_CHARS, max_size=12), max_size=3), single=st.booleans())
def test_fuzz_lite_translates_any_text_as_keras(contract, texts, single):
    arg = texts[0] if single and texts else texts
    got, want = _both(
        lambda: contract["translator"].translate(arg),
        lambda: contract["keras_translator"].translate(arg),
    )
    assert got == want, arg


@_LITE_SETTINGS
@given(
    sentences=st.lists(
        st.one_of(
            st.text(_CHARS, max_size=40),
            st.lists(st.text(_CHARS, min_size=1, max_size=6), max_size=5),
        ),
        max_size=4,
    )
)
def test_fuzz_lite_tags_any_sentence_as_keras(contract, sentences):
    got, want = _both(
        lambda: contract["tagger"].tag(sentences), lambda: contract["keras_tagger"].tag(sentences)
    )
    assert got == want, sentences
