"""Attention speed and memory: ours vs keras.layers.MultiHeadAttention.

    python -m benchmarks.attention_bench [--quick]
    python -m benchmarks.attention_bench memory --impl ours|keras --length N

Every ratio is taken side by side in one process (speed) or from twin child
processes started one after the other (peak memory, which must be measured in
a fresh process). Figures:
1. forward and forward+backward time, B=16 N=256 and B=4 N=1024, D=256,
   8 heads, plain tf.function and jit_compile=True;
2. achieved FLOP/s of our forward at N=1024 as a fraction of this machine's
   large-matmul FLOP/s;
3. peak memory and time of self-attention at N = 2k, 8k, 32k (B=1, 8 heads,
   head dim 64), ours with chunk_size vs Keras's;
4. forward+backward at N = 8k (B=1, 8 heads, head dim 64): ours chunked vs
   ours full vs Keras (`python -m benchmarks.attention_bench long-backward`).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

HEADS, HIDDEN = 8, 256
LONG_HEAD_DIM = 64
CHUNK = 512


def median_time(fn, *args, repeats=5, warmup=2):
    for _ in range(warmup):
        _block(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _block(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _block(result):
    import tensorflow as tf

    for t in tf.nest.flatten(result):
        np.asarray(t)


def _layers(key_dim, heads=HEADS, chunk_size=None):
    import keras

    from layers import MultiHeadAttention

    ours = MultiHeadAttention(num_heads=heads, key_dim=key_dim, chunk_size=chunk_size)
    keras_layer = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=key_dim)
    return ours, keras_layer


def _functions(ours, theirs, jit):
    import tensorflow as tf

    def grad_fn(layer, call):
        @tf.function(jit_compile=jit)
        def step(x):
            with tf.GradientTape() as tape:
                y = call(x)
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, layer.trainable_variables)

        return step

    return {
        "ours_forward": tf.function(lambda x: ours(x), jit_compile=jit),
        "keras_forward": tf.function(lambda x: theirs(x, x), jit_compile=jit),
        "ours_backward": grad_fn(ours, lambda x: ours(x)),
        "keras_backward": grad_fn(theirs, lambda x: theirs(x, x)),
    }


def speed(quick=False):
    """Figure 1: forward and forward+backward, ours vs Keras, same weights."""
    import tensorflow as tf

    rows = []
    shapes = [(16, 256), (4, 1024)] if not quick else [(4, 256)]
    for batch, length in shapes:
        x = tf.random.stateless_normal((batch, length, HIDDEN), seed=(1, 2))
        ours, theirs = _layers(HIDDEN // HEADS)
        ours(x)
        theirs(x, x)
        for name in ("query", "key", "value", "output"):
            getattr(ours, f"{name}_dense").set_weights(
                getattr(theirs, f"_{name}_dense").get_weights()
            )
        for jit in (False, True):
            fns = _functions(ours, theirs, jit)
            # Interleave ours and Keras's so drifting machine load hits both,
            # and take the ratio within each round (ours timed right before
            # Keras's): the median of those ratios is steadier than a ratio
            # of medians, which a slow spell on one side can swing by 10%.
            t = {k: [] for k in fns}
            for _ in range(1 if quick else 5):
                for key, fn in fns.items():
                    t[key].append(median_time(fn, x, repeats=3 if quick else 5))
            for kind in ("forward", "backward"):
                ours_t, keras_t = np.array(t[f"ours_{kind}"]), np.array(t[f"keras_{kind}"])
                rows.append(
                    {
                        "figure": "attention_speed",
                        "batch": batch,
                        "length": length,
                        "jit_compile": jit,
                        "pass": "forward" if kind == "forward" else "forward+backward",
                        "ours_ms": 1e3 * float(np.median(ours_t)),
                        "keras_ms": 1e3 * float(np.median(keras_t)),
                        "ratio": float(np.median(ours_t / keras_t)),
                    }
                )
    return rows


def flops_fraction(quick=False):
    """Figure 2: our forward's FLOP/s over a large matmul's, same run.

    The matmul and the attention forward are timed in interleaved rounds and
    each figure is the median over rounds, so a slow spell of the machine
    weighs on both sides instead of on one."""
    import tensorflow as tf

    size = 1024 if quick else 2048
    a = tf.random.stateless_normal((size, size), seed=(3, 4))
    matmul = tf.function(lambda m: tf.matmul(m, m))

    batch, length = (2, 512) if quick else (4, 1024)
    x = tf.random.stateless_normal((batch, length, HIDDEN), seed=(5, 6))
    ours, _ = _layers(HIDDEN // HEADS)
    ours(x)
    forwards = [tf.function(lambda t: ours(t), jit_compile=jit) for jit in (False, True)]
    matmul_times, attention_times = [], []
    for _ in range(1 if quick else 3):
        matmul_times.append(median_time(matmul, a))
        attention_times.append(min(median_time(fn, x) for fn in forwards))
    matmul_flops = 2 * size**3 / float(np.median(matmul_times))
    d = HIDDEN
    projections = 4 * 2 * batch * length * d * d
    attention = 2 * 2 * batch * length * length * d  # scores + weighted sum
    achieved = (projections + attention) / float(np.median(attention_times))
    return [
        {
            "figure": "flops",
            "batch": batch,
            "length": length,
            "matmul_gflops": matmul_flops / 1e9,
            "attention_gflops": achieved / 1e9,
            "fraction": achieved / matmul_flops,
        }
    ]


def memory_child(impl, length, backward=False):
    """Runs in a fresh process: peak RSS growth and time of one forward (or
    forward+backward, with respect to the input and the weights).
    `impl`: "ours" (chunked), "ours_full" or "keras"."""
    import tensorflow as tf

    x = tf.random.stateless_normal((1, length, HEADS * LONG_HEAD_DIM), seed=(7, 8))
    ours, theirs = _layers(LONG_HEAD_DIM, chunk_size=None if impl == "ours_full" else CHUNK)
    layer = theirs if impl == "keras" else ours
    call = (lambda t: layer(t, t)) if impl == "keras" else (lambda t: layer(t))
    if backward:
        forward = call

        def call(t):
            with tf.GradientTape() as tape:
                tape.watch(t)
                y = forward(t)
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, [t] + layer.trainable_variables)

    small = tf.random.stateless_normal((1, 8, HEADS * LONG_HEAD_DIM), seed=(7, 8))
    _block(call(small))  # build and warm up on a short input
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = call(x)
    _block(out)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Absolute peak RSS of the process (TensorFlow itself included) and its
    # growth during the long call; 0 growth means the call stayed under the
    # peak already reached while building and warming up.
    return {
        "impl": impl,
        "length": length,
        "backward": backward,
        "seconds": seconds,
        "peak_rss_mb": peak / 1024.0,
        "growth_mb": (peak - base) / 1024.0,
    }


def _available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def long_sequences(quick=False):
    """Figure 3: ours (chunked) vs Keras at long lengths, each in a child."""
    rows = []
    lengths = [2048] if quick else [2048, 8192, 32768]
    for length in lengths:
        for impl in ("ours", "keras"):
            # Keras materialises [heads, N, N] float32 scores several times
            # over (scores, softmax, dropout-free copy): do not start a child
            # that would exhaust the machine.
            need_mb = 3 * HEADS * length * length * 4 / 2**20
            if impl == "keras" and need_mb > 0.6 * _available_mb():
                rows.append(
                    {
                        "figure": "long",
                        "impl": impl,
                        "length": length,
                        "error": f"not run: needs ~{need_mb / 1024:.0f} GB for [8, N, N] scores",
                    }
                )
                continue
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.attention_bench",
                    "memory",
                    "--impl",
                    impl,
                    "--length",
                    str(length),
                ],
                capture_output=True,
                text=True,
                timeout=3600,
            )
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
                rows.append({"figure": "long", "impl": impl, "length": length, "error": tail[:200]})
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"figure": "long", **result})
    return rows


def long_backward(quick=False, length=8192, chunks=(512, 1024), rounds=3):
    """Figure 4: forward+backward at a long length (B=1, 8 heads, head dim
    64, plain tf.function): ours chunked (the flash-attention-2 backward) vs
    ours full vs Keras, interleaved round by round; ratios to ours full
    within each round."""
    import tensorflow as tf

    from layers import MultiHeadAttention

    if quick:
        length, chunks, rounds = 1024, (256,), 1
    x = tf.random.stateless_normal((1, length, HEADS * LONG_HEAD_DIM), seed=(3, 4))
    impls = {f"chunked_{c}": MultiHeadAttention(HEADS, LONG_HEAD_DIM, chunk_size=c) for c in chunks}
    impls["full"] = MultiHeadAttention(HEADS, LONG_HEAD_DIM)
    import keras

    keras_layer = keras.layers.MultiHeadAttention(HEADS, LONG_HEAD_DIM)
    small = x[:, :8]
    keras_layer(small, small)
    fns = {}
    for layer in impls.values():
        layer(small)
    for layer in impls.values():
        layer.set_weights(impls["full"].get_weights())
    for name, layer in list(impls.items()) + [("keras", keras_layer)]:
        call = (lambda l: lambda t: l(t, t))(layer) if name == "keras" else (lambda l: l)(layer)

        def make(layer=layer, call=call):
            @tf.function
            def step(t):
                with tf.GradientTape() as tape:
                    tape.watch(t)
                    y = call(t)
                    loss = tf.reduce_sum(y * y)
                return tape.gradient(loss, [t] + layer.trainable_variables)

            return step

        fns[name] = make()
    for fn in fns.values():
        _block(fn(x))  # trace and warm up
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            _block(fn(x))
            times[name].append(time.perf_counter() - start)
    full = np.array(times["full"])
    rows = []
    for name, t in times.items():
        t = np.array(t)
        rows.append(
            {
                "figure": "long_backward",
                "impl": name,
                "length": length,
                "fwdbwd_s": float(np.median(t)),
                "vs_full": float(np.median(t / full)),
            }
        )
    return rows


def run(quick=False):
    return speed(quick) + flops_fraction(quick) + long_sequences(quick) + long_backward(quick)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention_bench")
    parser.add_argument(
        "mode", nargs="?", default="all", choices=["all", "memory", "speed", "long-backward"]
    )
    parser.add_argument("--impl", choices=["ours", "ours_full", "keras"], default="ours")
    parser.add_argument("--backward", action="store_true", help="memory: forward+backward")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "memory":
        print(json.dumps(memory_child(args.impl, args.length, args.backward)))
        return 0
    if args.mode in ("speed", "long-backward"):
        rows = speed(args.quick) if args.mode == "speed" else long_backward(args.quick)
        for row in rows:
            print(json.dumps(row))
        return 0
    for row in run(args.quick):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
