"""The chunked path's forward+backward memory is linear in the length.

Nothing big runs: XLA's compile-time scratch memory
(`jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes`) is
read for the jitted forward+backward of `MultiHeadAttention` on JAX's CPU
backend at two lengths. Autodiff of the block loop keeps every block's
softmax for the backward (quadratic: x16 when the length grows x4); a
flash-attention-2 backward keeps the output and one log-sum-exp per row.

Run in a subprocess with KERAS_BACKEND=jax (this process has TensorFlow's
backend); `python -m tests.test_attention_memory` prints the figures.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT, LONG = 1024, 4096


def scratch_bytes(length, chunk_size, causal=False, padded=False):
    """XLA's temp bytes for d/dx sum(MHA(x)^2) at `length` (JAX backend)."""
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np

    layer = MultiHeadAttention_(chunk_size, causal)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, length, 64)), "float32")
    mask = np.ones((1, length), bool)
    if padded:
        mask[:, length - 7:] = False
    layer(x[:, :8])
    params = [v.value for v in layer.trainable_variables]

    def loss(params, x):
        y, _ = layer.stateless_call(params, [], x, query_mask=jnp.asarray(mask))
        return jnp.sum(y * y)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    del keras
    return int(compiled.memory_analysis().temp_size_in_bytes)


def MultiHeadAttention_(chunk_size, causal):
    from layers import MultiHeadAttention

    return MultiHeadAttention(num_heads=4, key_dim=16, chunk_size=chunk_size, causal=causal)


def measure():
    out = {}
    for causal in (False, True):
        tag = "causal" if causal else "plain"
        out[f"chunked_{tag}"] = [scratch_bytes(n, 256, causal, padded=True) for n in (SHORT, LONG)]
    out["full"] = [scratch_bytes(n, None) for n in (SHORT, LONG)]
    return out


def test_chunked_backward_memory_grows_linearly():
    pytest.importorskip("jax")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_attention_memory"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    ratio = LONG / SHORT
    full_long = figures["full"][1]
    # The full path must itself be quadratic, or this comparison says nothing.
    assert figures["full"][1] > 0.5 * ratio**2 * figures["full"][0], figures
    for name in ("chunked_plain", "chunked_causal"):
        short, long = figures[name]
        # Linear, with room for fixed costs: x4 length may cost at most x6
        # (a quadratic backward costs ~x16).
        assert long <= 1.5 * ratio * short, (name, figures)
        assert long < full_long / 8, (name, figures)


if __name__ == "__main__":
    print(json.dumps(measure()))
