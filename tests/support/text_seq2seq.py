"""The tiny untrained text seq2seq model of the export tests (a unigram nmt_nfkc
tokenizer), and its run directory and SavedModel, exported once per test session.

`text_seq2seq_model()` is built once per test process from a fixed seed: the same
weights and tokenizer in every process. `shared_export()` is the run directory the
bundle tests read (model.keras, config.json, metrics.json) and its SavedModel, which the
stock-serving, deploy and bundle tests all serve or read: the first caller in the
session (either xdist worker) writes and exports it while holding a lock file, every
later caller waits for that and reads the same files, after checking that its own
`text_seq2seq_model()` is the exported model (same weights and tokenizer). The files
are read-only: a test that changes one copies it first.
"""

import fcntl
import functools
import hashlib
import json
import os
import tempfile

# What the shared run's config.json and metrics.json say (the bundle's model card
# reports them: tests/export/test_bundle.py).
DATA = {"name": "tiny-seq2seq", "licence": "CC0"}
METRICS = {"test_bleu": 12.5, "test_chrf": 40.25, "dev_acc": 0.5, "bleu_signature": "nrefs:1"}

# The session's shared folder (tests/support/shared_runs.root), set by the session
# fixture in tests/conftest.py; a folder of this process's own outside pytest.
FOLDER = [None]


def text_tokenizer():
    from zoo.seq2seq.tokenization import train_sentencepiece

    corpus = [
        "a man in a blue shirt is standing on a ladder",
        "une femme lit un livre dans le parc",
        "two dogs are playing in the snow",
        "des enfants jouent au football",
        "über die Straße",
        "ｆｕｌｌｗｉｄｔｈ",
    ] * 20
    return train_sentencepiece(corpus, vocab_size=70)


@functools.lru_cache(maxsize=None)
def text_seq2seq_model():
    """A tiny untrained seq2seq model with a unigram nmt_nfkc tokenizer, built once per
    test process."""
    import keras

    import zoo
    import zoo.models  # noqa: F401
    from zoo.seq2seq.tokenization import encode_proto

    keras.utils.set_random_seed(3)
    return zoo.build(
        "seq2seq",
        tokenizer=encode_proto(text_tokenizer()),
        hidden_dim=16,
        num_heads=2,
        num_layers=1,
        intermediate_dim=32,
        max_source_length=16,
        max_target_length=12,
    )


def _fingerprint(model):
    digest = hashlib.sha256(bytes(model.tokenizer.proto))
    for weight in model.weights:
        digest.update(weight.path.encode())
        digest.update(weight.numpy().tobytes())
    return digest.hexdigest()


def _folder():
    if FOLDER[0] is None:
        FOLDER[0] = tempfile.mkdtemp(prefix="zoo-text-seq2seq-")
    return os.fspath(FOLDER[0])


@functools.lru_cache(maxsize=None)
def shared_export():
    """(run directory, SavedModel version directory) of `text_seq2seq_model()`, written
    once per test session."""
    from export.savedmodel import export_savedmodel

    model = text_seq2seq_model()
    folder = os.path.join(_folder(), "text-seq2seq")
    run = os.path.join(folder, "run")
    done = os.path.join(folder, "done.json")
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(done):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)  # a failed earlier attempt
            os.makedirs(run)
            model.save(os.path.join(run, "model.keras"))
            config = {"kind": "seq2seq", "data": DATA, "model": {}, "train": {}}
            with open(os.path.join(run, "config.json"), "w") as f:
                json.dump(config, f)
            with open(os.path.join(run, "metrics.json"), "w") as f:
                json.dump(METRICS, f)
            version = export_savedmodel(run, os.path.join(folder, "serving", "mt"))
            with open(done, "w") as f:
                json.dump({"version": version, "fingerprint": _fingerprint(model)}, f)
    with open(done) as f:
        made = json.load(f)
    assert made["fingerprint"] == _fingerprint(model), "text_seq2seq_model() differs"
    return run, made["version"]
