"""Attention on an accelerator under JAX: ours vs keras.layers.MultiHeadAttention.

    KERAS_BACKEND=jax python -m benchmarks.attention_gpu [--smoke] [--out PREFIX] [--only KIND]

Runs with JAX and Keras only (TensorFlow need not be installed, and is never
imported: every child checks). Every configuration runs in a fresh
subprocess, so peak device memory is that configuration's own. Before any
timing a child checks that outputs and gradients agree (ours vs Keras with
the same weights, or chunked vs full/Keras at a length both fit) and times
nothing if they do not. Writes PREFIX.md (a table per figure, headed by the
device) and PREFIX.json. Figures:

1. `speed`: forward and forward+backward of one self-attention layer, 8
   heads, B x N x D in 16x256x256, 4x1024x256, 2x4096x512, 1x16384x512,
   float32 and bfloat16 (jitted `stateless_call`, medians); and with a
   local window (`sliding_window=256`, keys `|i - j| < 256`, causal and
   symmetric) at 4x1024x256 and 2x4096x512: a causal window is JAX's
   kernel's own on GPUs (`local_window_size`, cuDNN's sliding window in
   bfloat16), a symmetric one stays in the mask;
2. `long`: chunked (chunk_size=1024) vs full vs Keras at N = 16k, 32k, 64k
   (B=1, D=512, 8 heads, bfloat16): time and peak memory, forward and
   forward+backward;
3. `encoder`: a 6-layer pre-LN encoder (d512, ff2048, B32, N512, bfloat16,
   Adam) trained with `train_on_batch`: tokens/s with our attention vs Keras's.

`--smoke` runs every figure at tiny shapes (CPU is fine) to prove the script
works; its numbers are not accelerator results and by default go to a
temporary directory, not to benchmarks/.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEADS = 8

SPEED_SHAPES = [(16, 256, 256), (4, 1024, 256), (2, 4096, 512), (1, 16384, 512)]
WINDOW_SHAPES = [(4, 1024, 256), (2, 4096, 512)]
SLIDING_WINDOW = 256  # Keras's `sliding_window`: keys with |i - j| < 256
LONG_LENGTHS = [16384, 32768, 65536]
LONG_DIM, CHUNK = 512, 1024
ENCODER = dict(layers=6, dim=512, ff=2048, batch=32, length=512)

SMOKE_SPEED_SHAPES = [(2, 32, 32), (1, 64, 64)]
SMOKE_WINDOW_SHAPES = [(1, 64, 64)]
SMOKE_SLIDING_WINDOW = 8
SMOKE_LONG_LENGTHS = [128, 256]
SMOKE_LONG_DIM, SMOKE_CHUNK = 32, 32
SMOKE_ENCODER = dict(layers=2, dim=32, ff=64, batch=2, length=16)


# ---------------------------------------------------------------- parent


def configurations(smoke):
    shapes = SMOKE_SPEED_SHAPES if smoke else SPEED_SHAPES
    lengths = SMOKE_LONG_LENGTHS if smoke else LONG_LENGTHS
    dim, chunk = (SMOKE_LONG_DIM, SMOKE_CHUNK) if smoke else (LONG_DIM, CHUNK)
    configs = []
    for dtype in ("float32", "bfloat16"):
        for batch, length, width in shapes:
            configs.append(dict(kind="speed", batch=batch, length=length, dim=width, dtype=dtype))
    window = SMOKE_SLIDING_WINDOW if smoke else SLIDING_WINDOW
    for dtype in ("float32", "bfloat16"):
        for batch, length, width in SMOKE_WINDOW_SHAPES if smoke else WINDOW_SHAPES:
            for causal in (True, False):
                configs.append(
                    dict(
                        kind="speed",
                        batch=batch,
                        length=length,
                        dim=width,
                        dtype=dtype,
                        window=window,
                        causal=causal,
                    )
                )
    for length in lengths:
        for impl in ("chunked", "full", "keras"):
            configs.append(
                dict(kind="long", impl=impl, length=length, dim=dim, chunk=chunk, dtype="bfloat16")
            )
    encoder = SMOKE_ENCODER if smoke else ENCODER
    for impl in ("ours", "keras"):
        configs.append(dict(kind="encoder", impl=impl, dtype="bfloat16", **encoder))
    for config in configs:
        config["smoke"] = smoke
    return configs


def run_child(config, timeout):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # peak = this config's
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.attention_gpu", "--child", json.dumps(config)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {**config, "error": f"timed out after {timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        if "RESOURCE_EXHAUSTED" in proc.stderr or "Out of memory" in proc.stderr:
            tail = "out of memory"
        return {**config, "error": tail[:300], "wall_s": round(time.perf_counter() - start, 1)}
    return json.loads(lines[-1])


def device_label():
    env = dict(os.environ, KERAS_BACKEND="jax")
    code = (
        "import jax, json; d = jax.devices()[0]; "
        "print(json.dumps({'platform': d.platform, 'device': d.device_kind, "
        "'count': jax.device_count(), 'jax': jax.__version__}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    import keras  # noqa: F401  (the version only; backend jax from the env)

    info["keras"] = keras.__version__
    info["python"] = platform.python_version()
    return info


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def markdown(rows, device, smoke):
    title = (
        f"{device['device']} ({device['platform']}), JAX {device['jax']}, Keras {device['keras']}"
    )
    lines = [f"# Attention under JAX on {title}", ""]
    if smoke:
        lines += ["**Smoke run at tiny shapes: these numbers are not benchmark results.**", ""]
    lines += [
        "Ratios < 1: ours is faster / smaller. Every row ran in its own process, "
        "after its agreement check (max errors in the JSON).",
        "",
    ]
    figures = [
        (
            "speed",
            [
                "batch",
                "length",
                "dim",
                "dtype",
                "window",
                "causal",
                "route",
                "ours_fwd_ms",
                "keras_fwd_ms",
                "fwd_ratio",
                "ours_fwdbwd_ms",
                "keras_fwdbwd_ms",
                "fwdbwd_ratio",
                "error",
            ],
        ),
        (
            "long",
            [
                "length",
                "impl",
                "dtype",
                "fwd_ms",
                "fwd_peak_mb",
                "fwdbwd_ms",
                "fwdbwd_peak_mb",
                "xla_temp_fwdbwd_mb",
                "checked_at",
                "error",
            ],
        ),
        (
            "encoder",
            [
                "impl",
                "layers",
                "dim",
                "batch",
                "length",
                "dtype",
                "tokens_per_s",
                "step_ms",
                "error",
            ],
        ),
    ]
    for kind, columns in figures:
        chosen = [r for r in rows if r["kind"] == kind]
        if kind == "encoder":
            keras_rate = next((r.get("tokens_per_s") for r in chosen if r["impl"] == "keras"), None)
            for r in chosen:
                if r.get("tokens_per_s") and keras_rate:
                    r["vs_keras"] = r["tokens_per_s"] / keras_rate
            columns = columns[:-1] + ["vs_keras", "error"]
        lines += [f"**{kind}**", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for r in chosen:
            lines.append("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- child


def _time(fn, *args, repeats):
    import jax

    jax.block_until_ready(fn(*args))  # compile
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    times.sort()
    return 1e3 * times[len(times) // 2]


def _peak_mb():
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**20


def _reset_peak():
    # No public reset: a fresh process per configuration, and forward before
    # forward+backward, so each figure is a running maximum that only grows.
    return None


def _attention_pair(dim, dtype, chunk=None, impl="ours", window=None, causal=False):
    """A self-attention layer and how to call it; `window` is Keras's
    `sliding_window` (keys `|i - j| < window`), which both layers take."""
    import keras

    from layers import MultiHeadAttention

    key_dim = dim // HEADS
    options = dict(num_heads=HEADS, key_dim=key_dim, dtype=dtype, sliding_window=window)
    if impl == "keras":
        layer = keras.layers.MultiHeadAttention(**options)

        def call(layer_, params, x):
            return layer_.stateless_call(params, [], x, x, use_causal_mask=causal)[0]

    else:
        layer = MultiHeadAttention(chunk_size=chunk, **options)

        def call(layer_, params, x):
            return layer_.stateless_call(params, [], x, use_causal_mask=causal)[0]

    return layer, call


def _functions(layer, call):
    import jax
    import jax.numpy as jnp

    def forward(params, x):
        return call(layer, params, x)

    def loss(params, x):
        y = call(layer, params, x)
        return jnp.sum(jnp.square(y.astype("float32")))

    return jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1)))


def _build(layer, x, impl):
    small = x[:, :8]
    layer(small, small) if impl == "keras" else layer(small)
    return [v.value for v in layer.trainable_variables]


def _max_rel_error(a, b):
    import numpy as np

    a, b = np.asarray(a, "float32"), np.asarray(b, "float32")
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))


def _agreement(config, x, ours_impl="ours", chunk=None):
    """Ours (full or chunked) vs Keras, same weights: output and every
    gradient, as max error relative to the largest Keras value."""
    import jax
    import numpy as np

    dtype = config["dtype"]
    structure = dict(window=config.get("window"), causal=config.get("causal", False))
    ours, ours_call = _attention_pair(config["dim"], dtype, chunk, **structure)
    theirs, their_call = _attention_pair(config["dim"], dtype, impl="keras", **structure)
    _build(ours, x, "ours")
    _build(theirs, x, "keras")
    ours.set_weights(theirs.get_weights())
    results = []
    for layer, call in ((ours, ours_call), (theirs, their_call)):
        params = [v.value for v in layer.trainable_variables]
        forward, grad = _functions(layer, call)
        results.append((forward(params, x), grad(params, x)))
    errors = [_max_rel_error(results[0][0], results[1][0])]
    # Gradients relative to the largest gradient value: some are zero in
    # exact arithmetic (the key bias's, softmax is shift-invariant) and
    # only rounding noise on both sides.
    ours_grads, their_grads = (
        [np.asarray(g, "float32") for g in jax.tree_util.tree_leaves(r[1])] for r in results
    )
    scale = max(float(np.max(np.abs(g))) for g in their_grads) + 1e-30
    errors += [float(np.max(np.abs(a - b))) / scale for a, b in zip(ours_grads, their_grads)]
    limit = 1e-4 if dtype == "float32" else 5e-2
    return max(errors), limit


def _route(config):
    """Which path our layer takes for `config` on this device: `"own"`
    (einsum), `"fused"` (`keras.ops.dot_product_attention`, any window in
    its mask) or `"jax window (left, right) IMPL"` (the window JAX's own)."""
    from layers import attention_ops

    if not attention_ops.fused_enabled():
        return "own"
    if config.get("window"):
        window = config["window"] - 1  # Keras's sliding_window -> ours
        local = attention_ops.fused_window(window, config.get("causal", False), config["dtype"])
        if local is not None:
            (left, right), implementation = local
            return f"jax window ({left}, {right}) {implementation}"
    return "fused"


def child_speed(config):
    import jax
    import numpy as np

    repeats = 2 if config["smoke"] else 10
    rng = np.random.default_rng(0)
    x = jax.numpy.asarray(
        rng.normal(size=(config["batch"], config["length"], config["dim"])), config["dtype"]
    )
    error, limit = _agreement(config, x)
    row = {**config, "max_rel_error": error, "tolerance": limit, "route": _route(config)}
    if not error <= limit:
        return {**row, "error": f"disagrees with Keras: {error:.3g} > {limit}"}
    structure = dict(window=config.get("window"), causal=config.get("causal", False))
    for impl in ("ours", "keras"):
        layer, call = _attention_pair(config["dim"], config["dtype"], impl=impl, **structure)
        params = _build(layer, x, impl)
        forward, grad = _functions(layer, call)
        row[f"{impl}_fwd_ms"] = _time(forward, params, x, repeats=repeats)
        row[f"{impl}_fwdbwd_ms"] = _time(grad, params, x, repeats=repeats)
    row["fwd_ratio"] = row["ours_fwd_ms"] / row["keras_fwd_ms"]
    row["fwdbwd_ratio"] = row["ours_fwdbwd_ms"] / row["keras_fwdbwd_ms"]
    return row


def child_long(config):
    import jax
    import numpy as np

    repeats = 2 if config["smoke"] else 3
    impl, length = config["impl"], config["length"]
    rng = np.random.default_rng(0)
    row = dict(config)
    # Agreement where the full computation fits: the configuration's own
    # length for the smoke run, at most 4096 tokens otherwise.
    check_length = length if config["smoke"] else min(length, 4096)
    x_check = jax.numpy.asarray(rng.normal(size=(1, check_length, config["dim"])), config["dtype"])
    if impl != "keras":
        error, limit = _agreement(
            config, x_check, chunk=config["chunk"] if impl == "chunked" else None
        )
        row.update(max_rel_error=error, tolerance=limit, checked_at=check_length)
        if not error <= limit:
            return {**row, "error": f"disagrees with Keras: {error:.3g} > {limit}"}
    x = jax.numpy.asarray(rng.normal(size=(1, length, config["dim"])), config["dtype"])
    layer, call = _attention_pair(
        config["dim"],
        config["dtype"],
        config["chunk"] if impl == "chunked" else None,
        impl="keras" if impl == "keras" else "ours",
    )
    params = _build(layer, x, "keras" if impl == "keras" else "ours")
    forward, grad = _functions(layer, call)
    try:
        row["xla_temp_fwdbwd_mb"] = (
            grad.lower(params, x).compile().memory_analysis().temp_size_in_bytes / 2**20
        )
    except Exception:  # memory_analysis is optional on some platforms
        row["xla_temp_fwdbwd_mb"] = None
    row["fwd_ms"] = _time(forward, params, x, repeats=repeats)
    row["fwd_peak_mb"] = _peak_mb()
    row["fwdbwd_ms"] = _time(grad, params, x, repeats=repeats)
    row["fwdbwd_peak_mb"] = _peak_mb()
    return row


def _encoder(config, attention):
    import keras

    x = inputs = keras.Input((config["length"], config["dim"]))
    for i in range(config["layers"]):
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        if attention == "keras":
            h = keras.layers.MultiHeadAttention(HEADS, config["dim"] // HEADS)(h, h)
        else:
            from layers import MultiHeadAttention

            h = MultiHeadAttention(HEADS, config["dim"] // HEADS)(h)
        x = x + h
        h = keras.layers.LayerNormalization(epsilon=1e-5)(x)
        h = keras.layers.Dense(config["ff"], activation="gelu")(h)
        x = x + keras.layers.Dense(config["dim"])(h)
    return keras.Model(inputs, x)


def child_encoder(config):
    import keras
    import numpy as np

    keras.config.set_dtype_policy("mixed_bfloat16" if config["dtype"] == "bfloat16" else "float32")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(config["batch"], config["length"], config["dim"])).astype("float32")
    y = rng.normal(size=x.shape).astype("float32")
    # Agreement: both models with the same weights give the same outputs.
    ours, theirs = _encoder(config, "ours"), _encoder(config, "keras")
    ours.set_weights(theirs.get_weights())
    error = _max_rel_error(ours.predict(x[:2], verbose=0), theirs.predict(x[:2], verbose=0))
    limit = 5e-2 if config["dtype"] == "bfloat16" else 1e-4
    row = {**config, "max_rel_error": error, "tolerance": limit}
    if not error <= limit:
        return {**row, "error": f"disagrees with Keras: {error:.3g} > {limit}"}
    model = ours if config["impl"] == "ours" else theirs
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse", jit_compile=True)
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    times = []
    for _ in range(3 if config["smoke"] else 20):
        start = time.perf_counter()
        loss = model.train_on_batch(x, y)
        float(np.asarray(loss))  # waits for the step
        times.append(time.perf_counter() - start)
    times.sort()
    step = times[len(times) // 2]
    row.update(step_ms=1e3 * step, tokens_per_s=config["batch"] * config["length"] / step)
    return row


def child(config):
    import keras

    if keras.backend.backend() != "jax":
        raise SystemExit("attention_gpu children run with KERAS_BACKEND=jax")
    started = time.perf_counter()
    row = {"speed": child_speed, "long": child_long, "encoder": child_encoder}[config["kind"]](
        config
    )
    row["wall_s"] = round(time.perf_counter() - started, 1)
    if any(name == "tensorflow" or name.startswith("tensorflow.") for name in sys.modules):
        row["error"] = "TensorFlow was imported"
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention_gpu")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check the script")
    parser.add_argument("--out", help="output prefix (PREFIX.md, PREFIX.json)")
    parser.add_argument("--only", choices=["speed", "long", "encoder"])
    parser.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.out is None:
        args.out = (
            os.path.join(tempfile.gettempdir(), "attention_gpu_smoke")
            if args.smoke
            else os.path.join(HERE, "attention_gpu")
        )
    device = device_label()
    rows = []
    for config in configurations(args.smoke):
        if args.only and config["kind"] != args.only:
            continue
        row = run_child(config, args.timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(args.out + ".json", "w") as f:
        json.dump({"device": device, "smoke": args.smoke, "rows": rows}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(rows, device, args.smoke))
    print(f"wrote {args.out}.md and {args.out}.json")
    failed = [r for r in rows if r.get("error") and "out of memory" not in r["error"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
