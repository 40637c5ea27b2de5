"""The tiny training settings the tests share: `python -m train KIND` flags for a run of
a few seconds (later flags on a command line win, so a test appends its own)."""

TAGGER_MODEL = {
    "word_dim": 16,
    "char_dim": 8,
    "char_filters": 16,
    "hidden_dim": 32,
    "num_heads": 2,
    "num_layers": 1,
}
# Smaller still, with one character kernel: the runs that resume, stop or distribute.
TAGGER_MINI_MODEL = {
    "word_dim": 16,
    "char_dim": 8,
    "char_filters": 8,
    "char_kernels": [3],
    "hidden_dim": 16,
    "num_heads": 2,
    "num_layers": 1,
}
TAGGER = [
    "--epochs",
    "1",
    *(f"--model-option={key}={value}" for key, value in TAGGER_MODEL.items()),
    "--verbose",
    "0",
]
# The embedded task stays the command's default (reverse); a test that needs one names it.
SEQ2SEQ = [
    "--task-length",
    "5",
    "--train-size",
    "64",
    "--epochs",
    "1",
    "--hidden-dim",
    "16",
    "--intermediate-dim",
    "32",
    "--dev-sample",
    "0",
    "--verbose",
    "0",
    "--max-minutes",
    "0",
]
# Batch 32, not the default 16: two D steps of 64 images, none of them an R1 step.
SAGAN = [
    "--epochs",
    "1",
    "--batch-size",
    "32",
    "--train-size",
    "64",
    "--test-size",
    "32",
    "--eval-samples",
    "32",
    "--epoch-eval-samples",
    "32",
    "--classifier-epochs",
    "1",
    "--width",
    "8",
    "--latent-dim",
    "16",
    "--verbose",
    "0",
]
FLAGS = {
    "tagger": TAGGER,
    "seq2seq": SEQ2SEQ,
    "universal_transformer": SEQ2SEQ,
    "sagan": SAGAN,
}

# The pages' own training commands (docs/*.md), with the tiny flags appended as
# tests/test_docs.py appends them: a test that needs such a run asks
# tests/support/shared_runs.py for it, and the page and the test share one run.
PAGE_RUNS = {
    "tagger": ["tagger", "--out", "runs/tagger", *TAGGER],
    "seq2seq": ["seq2seq", "--task", "reverse", "--out", "runs/mt", *SEQ2SEQ],
    "sagan": ["sagan", "--out", "runs/sagan", *SAGAN],
}
