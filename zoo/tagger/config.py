"""The tagger's architectures and hyper-parameter defaults, Keras-free, so commands
and replay read them without importing TensorFlow."""

ARCHS = ("attention", "fc", "window", "bilstm")

# Hyper-parameters shared by all archs (same input pipeline and head) and per-arch ones.
DEFAULTS = {
    "word_dim": 100,
    "char_dim": 32,
    "char_filters": 64,
    "char_kernels": [2, 3, 4],
    "hidden_dim": 128,
    "num_layers": None,  # per arch, see ARCH_DEFAULTS
    "num_heads": 4,
    "dropout": 0.2,
    "word_dropout": 0.25,
    "window": 5,
    "conv_kernel": 3,
    "rotary": True,
    "attention_window": None,
}
# The attention tagger leans on word identity more than the BiLSTM does; replacing
# 60% of training words by <unk> makes it read characters and context, and a wider
# model then pays (the UD LinES sweep: benchmarks/tagger.md).
ARCH_DEFAULTS = {
    "attention": {"num_layers": 3, "word_dropout": 0.6, "hidden_dim": 192},
    "bilstm": {"num_layers": 2},
    "fc": {"num_layers": 1},
    "window": {"num_layers": 1},
}
