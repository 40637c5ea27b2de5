"""`python -m train universal_transformer`: `python -m train seq2seq --arch universal_transformer`."""

from train import seq2seq

DEFAULTS = {"arch": "universal_transformer"}
run = seq2seq.run
CONFIG = seq2seq.CONFIG
