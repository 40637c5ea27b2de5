"""Universal Transformer: `zoo.build("universal_transformer", vocabulary_size=..., ...)`.

One shared encoder block and one shared decoder block, each applied
`num_steps` times; before every application the position and the timestep
coordinate embeddings (sinusoidal, Dehghani et al. 2018, eq. 3) are added.
With `act=True`, Adaptive Computation Time halts each position on its own: a
sigmoid halting unit accumulates probability per position, the output is the
halting-weighted mix of the step states, and the ponder cost (steps plus
remainder, averaged over real tokens) is added to the loss.

Cached decoding works as for `Seq2SeqTransformer`: one self-attention cache per
recurrent step (each step attends over the previous tokens' states at that
step) and one cross-attention cache (the shared block projects the encoder
output the same way at every step). Halting depends only on the position's
own states, so cached and full decoding agree with ACT too.
"""

import keras
from keras import ops

from layers import SinusoidalPositionEncoding, TransformerDecoderBlock, TransformerEncoderBlock
from layers.validation import check_int
from zoo.seq2seq.samplers import check_number
from zoo.seq2seq.transformer import Seq2SeqTransformer


@keras.saving.register_keras_serializable(package="zoo")
class UniversalTransformer(Seq2SeqTransformer):
    """Universal Transformer encoder-decoder (Dehghani et al., 2018).

    Args:
        num_steps: int, recurrent applications of the shared blocks (T).
        act: bool, Adaptive Computation Time halting per position.
        act_threshold: float in (0, 1], halting threshold (1 - epsilon).
        ponder_weight: float >= 0, weight of the ponder cost in the loss.
        Other arguments as `Seq2SeqTransformer` (`num_layers` is ignored).

    Call arguments:
        As `Seq2SeqTransformer`.

    Returns:
        Logits `[B, T, vocabulary_size]`.

    Example:

    >>> import numpy as np, zoo
    >>> model = zoo.build("universal_transformer", vocabulary_size=20, hidden_dim=16,
    ...                   num_steps=3, num_heads=2, intermediate_dim=32, act=True)
    >>> tuple(model({"source_ids": np.array([[5, 6]]),
    ...              "target_ids": np.array([[2]])}).shape)
    (1, 1, 20)

    References:
        - [Dehghani et al., 2018](https://arxiv.org/abs/1807.03819)
        - [Graves, 2016](https://arxiv.org/abs/1603.08983) (ACT)
    """

    kind = "universal_transformer"

    def __init__(
        self,
        vocabulary_size,
        num_steps=4,
        act=False,
        act_threshold=0.99,
        ponder_weight=0.01,
        **kwargs,
    ):
        self.num_steps = check_int("num_steps", num_steps)
        self.act = bool(act)
        self.act_threshold = check_number("act_threshold", act_threshold, 0.0, 1.0)
        self.ponder_weight = check_number("ponder_weight", ponder_weight, 0.0, low_open=False)
        kwargs["num_layers"] = 1
        super().__init__(vocabulary_size, **kwargs)
        self.timestep_signal = SinusoidalPositionEncoding().encoding(
            self.num_steps, self.hidden_dim
        )

    def _make_blocks(self):
        self.encoder_block = TransformerEncoderBlock(
            window=self.window, name="encoder_shared", **self._block_kwargs()
        )
        self.decoder_block = TransformerDecoderBlock(
            cross_length_scale=self.cross_length_scale,
            name="decoder_shared",
            **self._block_kwargs(),
        )
        # Bias 1: start by halting after about one or two steps (as tensor2tensor).
        self.encoder_halting, self.decoder_halting = (
            keras.layers.Dense(
                1,
                "sigmoid",
                name=f"{part}_halting",
                bias_initializer=keras.initializers.Constant(1.0),
                dtype=self.dtype_policy,
            )
            for part in ("encoder", "decoder")
        )
        self.encoder_blocks = [self.encoder_block]
        self.decoder_blocks = [self.decoder_block]

    @property
    def num_self_caches(self):
        return self.num_steps

    def _coordinates(self, x, step, encoding):
        # Positions and the timestep are added before every step (eq. 3).
        return x + encoding + ops.cast(self.timestep_signal[step], x.dtype)

    def _run_blocks(self, x, encoding, step, part, mask, training):
        """`step(0, t, x)` (the shared block) num_steps times, with ACT if enabled."""
        state = self.embedding_dropout(x, training=training)
        if not self.act:
            for t in range(self.num_steps):
                state = step(0, t, self._coordinates(state, t, encoding))
            return state
        halting_layer = self.encoder_halting if part == "encoder" else self.decoder_halting
        halting = ops.zeros_like(state[..., 0])
        remainders = ops.zeros_like(halting)
        updates = ops.zeros_like(halting)
        output = ops.zeros_like(state)
        for t in range(self.num_steps):
            state = self._coordinates(state, t, encoding)
            p = ops.squeeze(halting_layer(state), -1)
            running = ops.cast(halting < 1.0, state.dtype)
            if t == self.num_steps - 1:
                # Graves's cap: every position still running halts at the last step.
                new_halted, running = running, ops.zeros_like(running)
            else:
                reached = halting + p * running
                new_halted = ops.cast(reached > self.act_threshold, state.dtype) * running
                running = ops.cast(reached <= self.act_threshold, state.dtype) * running
            halting = halting + p * running
            remainders = remainders + new_halted * (1.0 - halting)
            halting = halting + new_halted * remainders
            updates = updates + running + new_halted
            weight = ops.expand_dims(p * running + new_halted * remainders, -1)
            state = step(0, t, state)
            output = state * weight + output * (1.0 - weight)
        if training and self.ponder_weight and mask is not None:
            m = ops.cast(mask, output.dtype)
            ponder = ops.sum((updates + remainders) * m) / ops.maximum(ops.sum(m), 1.0)
            self.add_loss(self.ponder_weight * ponder)
        return output

    # Keras's get_config: the constructor arguments it adds (a mirror of Keras).
    def get_config(self):
        config = super().get_config()
        config.pop("num_layers", None)
        config.update(
            num_steps=self.num_steps,
            act=self.act,
            act_threshold=self.act_threshold,
            ponder_weight=self.ponder_weight,
        )
        return config
