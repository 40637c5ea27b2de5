"""The seq2seq model sizes and the model config a run's flags give, Keras-free."""

from zoo.cli import UsageError

# Sized for Multi30k-sized data (29k pairs) and a 30-minute budget on a 2-core CPU:
# about 5.7e8 training FLOPs per sentence pair (16 + 19 subwords), so one epoch is
# ~1.6e13 FLOPs and a 2-core CPU sustaining 30-50 GFLOP/s does 3-5 epochs in 30
# minutes. The feed-forward width (512, not 4 * 256) and a 6k joint vocabulary (the
# tied output projection is a large share of the cost) buy epochs, which matter more
# than width at this budget.
TEXT_MODEL = {
    "hidden_dim": 256,
    "num_layers": 3,
    "num_heads": 4,
    "intermediate_dim": 512,
    "dropout": 0.1,
    "max_source_length": 128,
    "max_target_length": 128,
}
TASK_MODEL = {
    "hidden_dim": 64,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_dim": 256,
    "dropout": 0.0,
    "max_source_length": 64,
    "max_target_length": 64,
}


# --recipe length: what carries to strings longer than the trained ones, by measurement
# (benchmarks/length_generalisation.md): positions beyond the trained ones seen in
# training, "the t-th from the end" as easy to find as "the t-th", and 64 sinusoidal
# features per end so that neighbouring positions far out stay apart.
LENGTH_POSITIONS = {"random_positions": True, "source_positions": "both_ends"}
LENGTH_HIDDEN_DIM = 128


def recipe(args, text):
    """--recipe as "length" or "plain" ("auto": length for universal_transformer on an
    embedded task and for --compare, with sinusoidal positions)."""
    if args.recipe != "auto":
        return args.recipe
    wanted = args.compare or (args.arch == "universal_transformer" and not text)
    return "length" if wanted and args.position == "sinusoidal" else "plain"


def model_config(args, text, longest_source=None):
    """The model's `zoo.build` kwargs; `longest_source`: the longest training source in
    tokens (`--cross-length-scale auto`)."""
    base = dict(TEXT_MODEL if text else TASK_MODEL)
    positions = {
        "random_positions": args.random_positions,
        "source_positions": args.source_positions,
    }
    if recipe(args, text) == "length":
        base["hidden_dim"] = LENGTH_HIDDEN_DIM
        positions.update(LENGTH_POSITIONS)
    for key in base:  # the flags of the same names override the sizes
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    scale = args.cross_length_scale
    if scale == "auto":  # the longest training source, within the model's limit, at least 2
        scale = max(2, min(longest_source or base["max_source_length"], base["max_source_length"]))
    base.update(
        position=args.position,
        norm_first=not args.post_ln,
        share_embeddings=not args.separate_embeddings,
        window=args.window,
        label_smoothing=args.label_smoothing,
        **positions,
        cross_length_scale=None if scale == "off" else int(scale),
    )
    if args.arch == "universal_transformer":
        base.pop("num_layers")
        base.update(num_steps=args.num_steps, act=args.act)
    if base["hidden_dim"] % base["num_heads"]:
        raise UsageError(
            f"--num-heads {base['num_heads']} must divide --hidden-dim {base['hidden_dim']}"
        )
    return base
