"""The chunked path's forward+backward memory is linear in the length.

Nothing big runs: XLA's compile-time scratch memory
(`jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes`) is
read for the jitted forward+backward of `MultiHeadAttention` on JAX's CPU
backend at two lengths. Autodiff of the block loop keeps every block's
softmax for the backward (quadratic: x16 when the length grows x4); a
flash-attention-2 backward keeps the output and one log-sum-exp per row.

Run in a subprocess with KERAS_BACKEND=jax (this process has TensorFlow's
backend); `python -m tests.layers.test_attention_memory` prints the figures.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.support.backends import run_under_jax
from tests.support.paths import ROOT

SHORT, LONG = 1024, 4096


def scratch_bytes(length, chunk_size, causal=False, padded=False, normalize="softmax"):
    """XLA's temp bytes for d/dx sum(MHA(x)^2) at `length` (JAX backend)."""
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np

    layer = MultiHeadAttention_(chunk_size, causal, normalize)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, length, 64)), "float32")
    mask = np.ones((1, length), bool)
    if padded:
        mask[:, length - 7 :] = False
    layer(x[:, :8])
    params = [v.value for v in layer.trainable_variables]

    def loss(params, x):
        y, _ = layer.stateless_call(params, [], x, query_mask=jnp.asarray(mask))
        return jnp.sum(y * y)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    del keras
    return int(compiled.memory_analysis().temp_size_in_bytes)


def MultiHeadAttention_(chunk_size, causal, normalize="softmax"):
    from layers import MultiHeadAttention

    return MultiHeadAttention(
        num_heads=4, key_dim=16, chunk_size=chunk_size, causal=causal, normalize=normalize
    )


def measure():
    out = {}
    for causal in (False, True):
        tag = "causal" if causal else "plain"
        out[f"chunked_{tag}"] = [scratch_bytes(n, 256, causal, padded=True) for n in (SHORT, LONG)]
    out["chunked_relu"] = [scratch_bytes(n, 256, normalize="relu") for n in (SHORT, LONG)]
    out["full"] = [scratch_bytes(n, None) for n in (SHORT, LONG)]
    return out


@pytest.mark.slow
def test_chunked_backward_memory_grows_linearly():
    stdout = run_under_jax("tests.layers.test_attention_memory", timeout=900)
    figures = json.loads(stdout.strip().splitlines()[-1])
    ratio = LONG / SHORT
    full_long = figures["full"][1]
    # The full path must itself be quadratic, or this comparison says nothing.
    assert figures["full"][1] > 0.5 * ratio**2 * figures["full"][0], figures
    for name in ("chunked_plain", "chunked_causal", "chunked_relu"):
        short, long = figures[name]
        # Linear, with room for fixed costs: x4 length may cost at most x6
        # (a quadratic backward costs ~x16).
        assert long <= 1.5 * ratio * short, (name, figures)
        assert long < full_long / 8, (name, figures)


if __name__ == "__main__":
    print(json.dumps(measure()))


TF_CHILD = """
import resource, sys
import tensorflow as tf
from layers import MultiHeadAttention
n = int(sys.argv[1])
layer = MultiHeadAttention(8, 64, chunk_size=256)
layer(tf.zeros((1, 8, 512)))
x = tf.random.stateless_normal((1, n, 512), seed=(1, 2))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x)
    loss = tf.reduce_sum(y * y)
grads = [g.numpy() for g in tape.gradient(loss, [x] + layer.trainable_variables)]
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


@pytest.mark.slow
def test_chunked_backward_memory_eager_tensorflow():
    """Eager TensorFlow: peak RSS growth of one chunked forward+backward at
    N = 2048 and 4096 (B1, 8 heads, d64) in fresh processes. A recording
    tape inside the custom gradient's forward keeps every block alive
    (measured before the fix: 1.8 GB at N=4096, 6.6 GB at 8192); one
    [8, N, N] float32 score tensor at 4096 is 512 MB."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    growth = {}
    for n in (2048, 4096):
        proc = subprocess.run(
            [sys.executable, "-c", TF_CHILD, str(n)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        growth[n] = int(proc.stdout.strip().splitlines()[-1])
    scores_4096 = 8 * 4096 * 4096 * 4
    assert growth[4096] < scores_4096, growth
    assert growth[4096] < 3 * max(growth[2048], 32 * 2**20), growth
