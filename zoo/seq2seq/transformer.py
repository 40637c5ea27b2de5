"""Encoder-decoder Transformer: `zoo.build("seq2seq", vocabulary_size=..., ...)`.

Self-attention encoder, decoder with masked self-attention and cross-attention,
LayerNorm (pre- or post-LN), sinusoidal or learned positions, shared or
separate embeddings. Built from `layers/`; decoding with the static-shape KV
cache lives in `zoo.seq2seq.decoding`, and the SentencePiece tokenizer (optional) is
stored in the model's config so a loaded model translates raw strings.
"""

import functools
import math

import keras
from keras import ops

from layers import (
    LayerNorm,
    PositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)
from layers.attention_ops import without_keras_mask
from layers.sinusoidal_position_encoding import position_range
from layers.validation import check_bool, check_choice, check_int, check_rate
from zoo.lite import Translator
from zoo.seq2seq import decoding, objectives  # noqa: F401  (objectives registers loss, metric)
from zoo.seq2seq.tokenization import PAD_ID, Tokenizer, decode_proto

POSITIONS = ("sinusoidal", "learned")
SOURCE_POSITIONS = ("start", "both_ends")


@keras.saving.register_keras_serializable(package="zoo")
class Seq2SeqTransformer(keras.Model):
    """Encoder-decoder Transformer for translation and summarisation.

    Args:
        vocabulary_size: int, number of token ids (0 = padding, 1 = unknown,
            2 = BOS, 3 = EOS; see `zoo.seq2seq.tokenization`).
        hidden_dim: int, model width.
        num_layers: int, encoder and decoder depth (each).
        num_heads: int, attention heads (must divide `hidden_dim`).
        intermediate_dim: int, feed-forward width.
        dropout: float, dropout on embeddings and every sub-layer.
        norm_first: bool, pre-LN (`True`, default) or post-LN (`False`).
        position: `"sinusoidal"` or `"learned"`.
        share_embeddings: bool, one token table for source, target and the
            output projection (needs a joint vocabulary), else three.
        max_source_length: int, longest source (learned positions; checks).
        max_target_length: int, longest output including EOS (cache size).
        window: `None` or int, local attention window of the encoder
            (`|i - j| <= window`) for long inputs.
        random_positions: bool. While training, each example's positions
            are a sorted random subset of `0..M-1` that starts at 0, one draw
            shared by its source and target, `M` the longest string the model
            takes (`max_source_length`, `max_target_length`, rounded up to a
            multiple of 8): the positions of strings longer than the trained
            ones are then trained too (Ruoss et al., 2023). Inference counts
            `0, 1, 2, ...` as usual. Sinusoidal positions only.
        source_positions: `"start"` or `"both_ends"`: the source's positions
            are counted from its start, or half the features count from the
            start and half from the end (the target's two halves both count
            from the start), so "the t-th from the end" is as easy to align
            with as "the t-th". Sinusoidal positions only.
        cross_length_scale: `None` or int `>= 2`, the longest trained source
            (in tokens): beyond it cross-attention grows sharper with the
            logarithm of the source length, so that it does not spread
            thinner over a longer input (`layers.MultiHeadAttention`'s
            `length_scale`). Unchanged up to that length.
        activation: feed-forward activation.
        label_smoothing: float, stored for training (the loss reads it).
        tokenizer: `None` or base64 SentencePiece model (`zoo.seq2seq.tokenization`).
        **kwargs: `keras.Model` arguments (`name`).

    Call arguments:
        inputs: dict with `"source_ids"` int32 `[B, S]` and `"target_ids"`
            int32 `[B, T]` (decoder inputs: BOS then the target, 0-padded).
        training: bool.

    Returns:
        Logits `[B, T, vocabulary_size]` (float32) for the next token.

    Example:

    >>> import numpy as np, zoo
    >>> model = zoo.build("seq2seq", vocabulary_size=20, hidden_dim=16,
    ...                   num_layers=1, num_heads=2, intermediate_dim=32)
    >>> logits = model({"source_ids": np.array([[5, 6, 7]]),
    ...                 "target_ids": np.array([[2, 5]])})
    >>> tuple(logits.shape)
    (1, 2, 20)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    kind = "seq2seq"  # the run kind (config.json's), as `zoo.load`'s Translator reports it

    # A Keras model's constructor: its arguments are get_config's keys (Keras's convention).
    def __init__(
        self,
        vocabulary_size,
        hidden_dim=256,
        num_layers=3,
        num_heads=4,
        intermediate_dim=1024,
        dropout=0.1,
        norm_first=True,
        position="sinusoidal",
        share_embeddings=True,
        max_source_length=128,
        max_target_length=128,
        window=None,
        random_positions=False,
        source_positions="start",
        cross_length_scale=None,
        activation="relu",
        label_smoothing=0.1,
        tokenizer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_int("vocabulary_size", vocabulary_size)
        self.hidden_dim = check_int("hidden_dim", hidden_dim)
        self.num_layers = check_int("num_layers", num_layers)
        self.num_heads = check_int("num_heads", num_heads)
        if hidden_dim % num_heads:
            raise ValueError(
                f"`num_heads` must divide `hidden_dim`. Received: num_heads={num_heads}, "
                f"hidden_dim={hidden_dim}"
            )
        self.intermediate_dim = check_int("intermediate_dim", intermediate_dim)
        self.dropout = check_rate("dropout", dropout)
        self.norm_first = bool(norm_first)
        self.position = check_choice("position", position, POSITIONS)
        self.share_embeddings = bool(share_embeddings)
        self.max_source_length = check_int("max_source_length", max_source_length)
        self.max_target_length = check_int("max_target_length", max_target_length)
        self.window = check_int("window", window, allow_none=True)
        self.random_positions = check_bool("random_positions", random_positions)
        self.source_positions = check_choice("source_positions", source_positions, SOURCE_POSITIONS)
        if position == "learned" and (random_positions or source_positions != "start"):
            raise ValueError(
                "`random_positions` and `source_positions='both_ends'` need "
                "position='sinusoidal'. Received: position='learned'"
            )
        self.cross_length_scale = check_int(
            "cross_length_scale", cross_length_scale, minimum=2, allow_none=True
        )
        self.activation = activation
        self.label_smoothing = check_rate("label_smoothing", label_smoothing)
        self.tokenizer_proto = tokenizer
        self._tokenizer = None
        self.head_dim = hidden_dim // num_heads

        self.source_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, name="source_embedding", dtype=self.dtype_policy
        )
        if self.share_embeddings:
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = TokenEmbedding(
                vocabulary_size, hidden_dim, name="target_embedding", dtype=self.dtype_policy
            )
        if position == "learned":
            self.source_position = PositionEmbedding(
                max_source_length, name="source_position", dtype=self.dtype_policy
            )
            self.target_position = PositionEmbedding(
                max_target_length, name="target_position", dtype=self.dtype_policy
            )
        else:
            self.source_position = SinusoidalPositionEncoding(
                name="source_position", dtype=self.dtype_policy
            )
            self.target_position = self.source_position
        self.embedding_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        if self.random_positions:
            self.position_seed = keras.random.SeedGenerator(0, name="position_seed")
        self._make_blocks()
        if self.norm_first:
            self.encoder_norm = LayerNorm(name="encoder_norm", dtype=self.dtype_policy)
            self.decoder_norm = LayerNorm(name="decoder_norm", dtype=self.dtype_policy)
        if not self.share_embeddings:
            self.output_projection = keras.layers.Dense(
                vocabulary_size, name="output_projection", dtype=self.dtype_policy
            )

    # ------------------------------------------------------------ structure
    def _block_kwargs(self):
        return dict(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            norm_first=self.norm_first,
            activation=self.activation,
            dtype=self.dtype_policy,
        )

    def _make_blocks(self):
        self.encoder_blocks = [
            TransformerEncoderBlock(window=self.window, name=f"encoder_{i}", **self._block_kwargs())
            for i in range(self.num_layers)
        ]
        self.decoder_blocks = [
            TransformerDecoderBlock(
                cross_length_scale=self.cross_length_scale,
                name=f"decoder_{i}",
                **self._block_kwargs(),
            )
            for i in range(self.num_layers)
        ]

    @property
    def num_self_caches(self):
        """Number of decoder self-attention caches (one per decoder layer)."""
        return len(self.decoder_blocks)

    def build(self, input_shape=None):
        if self.built:
            return
        ids = ops.ones((1, 2), "int32")
        self.call({"source_ids": ids, "target_ids": ids})
        self.built = True

    # ------------------------------------------------------------ pieces
    def _embed(self, table, ids):
        return table(ids) * ops.cast(math.sqrt(self.hidden_dim), self.compute_dtype)

    def _sample_positions(self, batch, length):
        """`[batch, length]` sorted random positions in `0..M-1` (`M` the longest
        string the model takes, rounded up to 8 as training batches are), the
        first 0 (where inference starts too). Each example draws a window
        `[a, b]` of `1..M-1` holding at least `length - 1` positions (`b`
        leaning to the top; `a` = 1 for half the examples, else uniform), then
        a sorted random subset of it: dense runs and wide spreads, near the
        start and far from it, so that neighbours are told apart at every
        position, as inference's `0, 1, 2, ...` needs."""
        span = -(-max(self.max_source_length, self.max_target_length) // 8) * 8
        need = ops.cast(length - 1, "float32")
        uniform = lambda: keras.random.uniform((batch, 1), seed=self.position_seed)  # noqa: E731
        # b in [length - 1, M - 1], denser towards the top (the square root of a
        # uniform draw), where fewer windows would reach otherwise.
        last = need + ops.sqrt(uniform()) * (span - 1 - need)
        first = 1.0 + ops.floor(uniform() * 2.0) * uniform() * (last - need)
        candidates = ops.arange(1, span, dtype="float32")[None, :]
        inside = ops.logical_and(candidates >= ops.floor(first), candidates <= ops.floor(last) + 1)
        scores = keras.random.uniform((batch, span - 1), seed=self.position_seed)
        scores = ops.where(inside, scores, -1.0)
        picked = ops.argsort(-scores, axis=-1)[:, : length - 1] + 1
        picked = ops.sort(ops.cast(picked, "float32"), axis=-1)
        return ops.concatenate([ops.zeros((batch, 1), "float32"), picked], axis=1)

    def _halves(self, layer, first, second, features):
        half = features // 2
        return ops.concatenate(
            [
                layer.encode_positions(first, features - half),
                layer.encode_positions(second, half),
            ],
            axis=-1,
        )

    def _source_encoding(self, x, mask, positions=None):
        """Position encoding `[B, S, D]` of the source (`positions`: `[B, >= S]`)."""
        layer = self.source_position
        if self.source_positions == "start":
            if positions is None:
                return layer(x, start_index=0)
            return layer(x, positions=positions[:, : ops.shape(x)[1]])
        length = ops.shape(x)[1]
        index = ops.arange(length, dtype="int32")[None, :]
        count = ops.sum(ops.cast(mask, "int32"), axis=1, keepdims=True)
        from_end = ops.maximum(count - 1 - index, 0)  # padding: 0 (masked anyway)
        if positions is None:
            start = ops.cast(ops.broadcast_to(index, ops.shape(from_end)), "float32")
            end = ops.cast(from_end, "float32")
        else:
            start = positions[:, :length]
            end = ops.take_along_axis(positions, from_end, axis=1)
        encoding = self._halves(layer, start, end, x.shape[-1])
        return ops.cast(encoding, x.dtype)

    def _target_encoding(self, y, start_index=0, positions=None):
        """Position encoding `[B, T, D]` of decoder inputs starting at `start_index`."""
        layer = self.target_position
        if self.source_positions == "start":  # (learned positions count from the start)
            if positions is None:
                return layer(y, start_index=start_index)
            return layer(y, positions=positions[:, : ops.shape(y)[1]])
        if positions is None:
            start = ops.reshape(position_range(ops.shape(y)[1], start_index), (1, -1))
        else:
            start = positions[:, : ops.shape(y)[1]]
        encoding = self._halves(layer, start, start, y.shape[-1])
        return ops.broadcast_to(ops.cast(encoding, y.dtype), ops.shape(y))

    def encode(self, source_ids, training=False, positions=None):
        """source ids `[B, S]` -> (encoder output `[B, S, D]`, mask `[B, S]` bool).
        `positions` (`[B, >= S]`) replaces `0, 1, 2, ...` (training draws them)."""
        source_ids = ops.cast(source_ids, "int32")
        mask = ops.not_equal(source_ids, PAD_ID)
        x = self._embed(self.source_embedding, source_ids)

        def step(block, t, h):
            return self.encoder_blocks[block](h, mask=mask, training=training)

        x = self._run_blocks(
            x, self._source_encoding(x, mask, positions), step, "encoder", mask, training
        )
        if self.norm_first:
            x = self.encoder_norm(x)
        # The Keras mask the blocks attach would make the cross-attention
        # projections warn; the mask is returned explicitly instead.
        return without_keras_mask(x), mask

    def _run_blocks(self, x, encoding, step, part, mask, training):
        """The embedded `x` plus its position `encoding` through `step(block, t, x)`
        for t = 0, 1, ... (block t; the Universal Transformer recurs on its one block
        instead, halting the `part`'s positions where `mask` is true)."""
        x = self.embedding_dropout(x + encoding, training=training)
        for t in range(self.num_layers):
            x = step(t, t, x)
        return x

    def decode(self, target_ids, encoder_output, source_mask, training=False, positions=None):
        """Full (teacher-forced) decoder: logits `[B, T, V]`."""
        target_ids = ops.cast(target_ids, "int32")
        target_mask = ops.not_equal(target_ids, PAD_ID)
        # BOS at position 0 is a real token even if a caller pads with it.
        y = self._embed(self.target_embedding, target_ids)
        encoding = self._target_encoding(y, positions=positions)

        def step(block, t, h):
            return self.decoder_blocks[block](
                h,
                encoder_output,
                decoder_mask=target_mask,
                encoder_mask=source_mask,
                training=training,
            )

        return self._logits(self._run_blocks(y, encoding, step, "decoder", target_mask, training))

    def _logits(self, y):
        if self.norm_first:
            y = self.decoder_norm(y)
        if self.share_embeddings:
            table = ops.cast(self.target_embedding.embeddings, y.dtype)
            logits = ops.matmul(y, ops.transpose(table))
        else:
            logits = self.output_projection(y)
        return ops.cast(logits, "float32")

    def call(self, inputs, training=None):
        positions = None
        if training and self.random_positions:
            source, target = inputs["source_ids"], inputs["target_ids"]
            length = ops.maximum(ops.shape(source)[1], ops.shape(target)[1])
            positions = self._sample_positions(ops.shape(source)[0], length)
        encoder_output, source_mask = self.encode(
            inputs["source_ids"], training=training, positions=positions
        )
        return self.decode(
            inputs["target_ids"],
            encoder_output,
            source_mask,
            training=training,
            positions=positions,
        )

    # ------------------------------------------------------------ cached decoding
    def cross_caches(self, encoder_output, split=False):
        """Projected encoder keys/values, one `[B, 2, S, H, d]` per decoder
        layer (with `split`, one rank-4 pair `(keys, values)` per layer)."""
        return tuple(
            block.compute_cross_attention_cache(encoder_output, split=split)
            for block in self.decoder_blocks
        )

    def empty_caches(self, batch_size, max_length):
        """Zeroed self-attention caches `[B, 2, max_length, H, d]`, one per layer."""
        shape = (batch_size, 2, max_length, self.num_heads, self.head_dim)
        return tuple(ops.zeros(shape, self.compute_dtype) for _ in range(self.num_self_caches))

    def decode_step(self, token_ids, index, self_caches, cross_caches, source_mask):
        """One decoder step.

        Args:
            token_ids: int32 `[B]`, the tokens at position `index`.
            index: scalar int, their position.
            self_caches: tuple of `[B, 2, L, H, d]` (see `empty_caches`), or
                of rank-4 pairs `(keys, values)`; returned in the same form.
            cross_caches: tuple from `cross_caches`.
            source_mask: bool `[B, S]`.

        Returns:
            (logits `[B, V]` float32, updated self caches).
        """
        ids = ops.reshape(ops.cast(token_ids, "int32"), (-1, 1))
        y = self._embed(self.target_embedding, ids)
        encoding = self._target_encoding(y, start_index=index)
        new = list(self_caches)

        def step(block, t, h):
            h, new[t] = self.decoder_blocks[block](
                h,
                self_attention_cache=self_caches[t],
                cache_index=index,
                cross_attention_cache=cross_caches[block],
                encoder_mask=source_mask,
            )
            return h

        # Dropout at inference is the identity: the step adds the encoding only.
        logits = self._logits(self._run_blocks(y, encoding, step, "decoder", None, False))
        # A reshape, not [:, 0]: a shrinking slice is off the GPU delegate's list.
        return ops.reshape(logits, (-1, logits.shape[-1])), tuple(new)

    # ------------------------------------------------------------ text
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if not self.tokenizer_proto:
                raise ValueError(
                    "this model has no tokenizer; pass ids, or build it with `tokenizer=`"
                )
            self._tokenizer = Tokenizer(decode_proto(self.tokenizer_proto))
        return self._tokenizer

    def translate(self, texts, beam_width=1, alpha=0.6, max_length=None, batch_size=64):
        """Raw strings in, strings out (greedy, or beam search if `beam_width > 1`):
        `zoo.lite.Translator.translate` on this model, as `zoo.load` runs it (a text
        of no tokens gives "")."""
        return self.translator(batch_size).translate(texts, beam_width, alpha, max_length)

    # KerasHub's generate convention (a mirror of Keras), run by zoo.load's `Translator`.
    def generate(
        self,
        texts,
        sampler="greedy",
        num_return_sequences=1,
        return_scores=False,
        max_length=None,
        seed=None,
        batch_size=64,
    ):
        """Raw strings in, generated strings out, with any `zoo.seq2seq.samplers` sampler.

        Args:
            texts: str or list of str.
            sampler: "greedy", "beam", "top_k", "top_p", "random" or a
                `zoo.seq2seq.samplers` object (e.g. `Beam(width=5, length_penalty=1.0)`,
                `Sampling(temperature=0.7, top_p=0.9)`).
            num_return_sequences: int, outputs per input (beam: at most its
                width, best first; sampling: independent draws).
            return_scores: bool, return (text, score) pairs (see
                `zoo.seq2seq.decoding.generate_ids` for what the score is).
            max_length: int, most output tokens (default: scaled to the input).
            seed: int, makes sampling repeatable.

        Returns:
            With one sequence and no scores, a str per input (as `translate`);
            otherwise, per input, a list of `num_return_sequences` (text, score)
            pairs. A single str input returns its entry alone; a text of no
            tokens gives "" (score 0.0), as `zoo.load` gives.
        """
        return self.translator(batch_size).generate(
            texts, sampler, num_return_sequences, return_scores, max_length, seed
        )

    def translator(self, batch_size=64):
        """This model as `zoo.load` gives its file: a `zoo.lite.Translator`."""
        generate_ids = functools.partial(decoding.generate_ids, self, batch_size=batch_size)
        return Translator(
            generate_ids, self.tokenizer, self.max_source_length, kind=self.kind, model=self
        )

    # Keras's get_config: every constructor argument (a mirror of Keras).
    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            hidden_dim=self.hidden_dim,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            norm_first=self.norm_first,
            position=self.position,
            share_embeddings=self.share_embeddings,
            max_source_length=self.max_source_length,
            max_target_length=self.max_target_length,
            window=self.window,
            random_positions=self.random_positions,
            source_positions=self.source_positions,
            cross_length_scale=self.cross_length_scale,
            activation=self.activation,
            label_smoothing=self.label_smoothing,
            tokenizer=self.tokenizer_proto,
        )
        return config

    def hparams(self):
        """The `zoo.build` kwargs without the tokenizer (for config.json)."""
        config = self.get_config()
        return {
            k: v for k, v in config.items() if k not in ("tokenizer", "name", "trainable", "dtype")
        }


def build_model(model_class, vocabulary_size=None, tokenizer=None, **kwargs):
    """`model_class(vocabulary_size, tokenizer=tokenizer, **kwargs)`, built; with
    a tokenizer (base64 SentencePiece model) the vocabulary size defaults to its
    size. `zoo.build("seq2seq", ...)` and `zoo.build("universal_transformer", ...)`."""
    if vocabulary_size is None:
        if tokenizer is None:
            raise ValueError(
                "pass `vocabulary_size` or `tokenizer`. Received: vocabulary_size=None"
            )
        vocabulary_size = Tokenizer(decode_proto(tokenizer)).vocabulary_size
    model = model_class(vocabulary_size, tokenizer=tokenizer, **kwargs)
    model.build()
    return model
