"""`layers.MultiHeadAttention` as a one-import replacement for
`keras.layers.MultiHeadAttention`: the keras-io English-to-Spanish Transformer
(fchollet, "English-to-Spanish translation with a sequence-to-sequence
Transformer"), written for Keras's layer, runs with ours swapped in and, with
the weights copied, gives Keras's outputs; Keras's constructor names map onto
ours."""

import keras
import numpy as np
import pytest
from keras import ops

import layers as zoo_layers

VOCAB, LENGTH, EMBED, LATENT, HEADS = 40, 12, 16, 32, 2


def nmt_transformer(MultiHeadAttention):  # noqa: N803  (the class the example imports)
    """The keras-io example's model (smaller), with `MultiHeadAttention` injected."""
    layers = keras.layers

    class TransformerEncoder(layers.Layer):
        def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
            super().__init__(**kwargs)
            self.attention = MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.dense_proj = keras.Sequential(
                [layers.Dense(dense_dim, activation="relu"), layers.Dense(embed_dim)]
            )
            self.layernorm_1 = layers.LayerNormalization()
            self.layernorm_2 = layers.LayerNormalization()
            self.supports_masking = True

        def call(self, inputs, mask=None):
            if mask is not None:
                padding_mask = ops.cast(mask[:, None, :], dtype="int32")
            else:
                padding_mask = None
            attention_output = self.attention(
                query=inputs, value=inputs, key=inputs, attention_mask=padding_mask
            )
            proj_input = self.layernorm_1(inputs + attention_output)
            proj_output = self.dense_proj(proj_input)
            return self.layernorm_2(proj_input + proj_output)

    class PositionalEmbedding(layers.Layer):
        def __init__(self, sequence_length, vocab_size, embed_dim, **kwargs):
            super().__init__(**kwargs)
            self.token_embeddings = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.position_embeddings = layers.Embedding(
                input_dim=sequence_length, output_dim=embed_dim
            )

        def call(self, inputs):
            length = ops.shape(inputs)[-1]
            positions = ops.arange(0, length, 1)
            return self.token_embeddings(inputs) + self.position_embeddings(positions)

        def compute_mask(self, inputs, mask=None):
            return ops.not_equal(inputs, 0)

    class TransformerDecoder(layers.Layer):
        def __init__(self, embed_dim, latent_dim, num_heads, **kwargs):
            super().__init__(**kwargs)
            self.attention_1 = MultiHeadAttention(
                num_heads=num_heads, key_dim=embed_dim, dropout=0.1
            )
            self.attention_2 = MultiHeadAttention(
                num_heads=num_heads, key_dim=embed_dim, dropout=0.1
            )
            self.dense_proj = keras.Sequential(
                [layers.Dense(latent_dim, activation="relu"), layers.Dense(embed_dim)]
            )
            self.layernorm_1 = layers.LayerNormalization()
            self.layernorm_2 = layers.LayerNormalization()
            self.layernorm_3 = layers.LayerNormalization()
            self.supports_masking = True

        def call(self, inputs, mask=None):
            inputs, encoder_outputs = inputs
            if mask is None:
                inputs_padding_mask, encoder_outputs_padding_mask = None, None
            else:
                inputs_padding_mask, encoder_outputs_padding_mask = mask
            attention_output_1 = self.attention_1(
                query=inputs,
                value=inputs,
                key=inputs,
                query_mask=inputs_padding_mask,
                use_causal_mask=True,
            )
            out_1 = self.layernorm_1(inputs + attention_output_1)
            attention_output_2 = self.attention_2(
                query=out_1,
                value=encoder_outputs,
                key=encoder_outputs,
                query_mask=inputs_padding_mask,
                key_mask=encoder_outputs_padding_mask,
            )
            out_2 = self.layernorm_2(out_1 + attention_output_2)
            proj_output = self.dense_proj(out_2)
            return self.layernorm_3(out_2 + proj_output)

    encoder_inputs = keras.Input(shape=(None,), dtype="int64", name="encoder_inputs")
    x = PositionalEmbedding(LENGTH, VOCAB, EMBED)(encoder_inputs)
    encoder_outputs = TransformerEncoder(EMBED, LATENT, HEADS)(x)
    decoder_inputs = keras.Input(shape=(None,), dtype="int64", name="decoder_inputs")
    x = PositionalEmbedding(LENGTH, VOCAB, EMBED)(decoder_inputs)
    x = TransformerDecoder(EMBED, LATENT, HEADS)([x, encoder_outputs])
    x = layers.Dropout(0.5)(x)
    decoder_outputs = layers.Dense(VOCAB, activation="softmax")(x)
    return keras.Model([encoder_inputs, decoder_inputs], decoder_outputs)


def _batch():
    rng = np.random.default_rng(0)
    src = rng.integers(1, VOCAB, (4, LENGTH))
    tgt = rng.integers(1, VOCAB, (4, LENGTH))
    src[1, 7:] = 0  # padded sentences, as the example's vectorised text
    src[3, 4:] = 0
    tgt[2, 5:] = 0
    return src, tgt


@pytest.mark.slow
def test_keras_io_nmt_transformer_runs_with_our_layer_and_equals_keras():
    keras.utils.set_random_seed(1)
    theirs = nmt_transformer(keras.layers.MultiHeadAttention)
    ours = nmt_transformer(zoo_layers.MultiHeadAttention)
    src, tgt = _batch()
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    ours.set_weights(theirs.get_weights())
    want = np.asarray(theirs([src, tgt], training=False))
    got = np.asarray(ours([src, tgt], training=False))
    # Padded target positions are where the layers differ by design (Keras gives
    # a fully masked query row uniform weights, ours zero); real tokens agree.
    real = tgt != 0
    np.testing.assert_allclose(got[real], want[real], rtol=0, atol=1e-5)
    # The example's training step runs too (compile and fit, dropout on).
    ours.compile("adam", "sparse_categorical_crossentropy")
    loss = ours.fit([src, tgt], tgt, epochs=1, verbose=0).history["loss"][0]
    assert np.isfinite(loss)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs,ours_kwargs",
    [
        (dict(output_shape=12), dict(output_dim=12)),
        (dict(output_shape=(12,)), dict(output_dim=12)),
        (dict(sliding_window=2), dict(window=1)),
        (dict(attention_axes=(1,), value_dim=3), dict(value_dim=3)),
    ],
)
def test_keras_constructor_names_compute_what_keras_computes(kwargs, ours_kwargs):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 5, 8)).astype("float32")
    v = rng.standard_normal((2, 5, 6)).astype("float32")
    ref = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    want = np.asarray(ref(q, v, use_causal_mask=True))
    for layer_kwargs in (kwargs, ours_kwargs):
        ours = zoo_layers.MultiHeadAttention(num_heads=2, key_dim=4, **layer_kwargs)
        ours(q, v)
        ours.set_weights(ref.get_weights())
        np.testing.assert_allclose(np.asarray(ours(q, v, use_causal_mask=True)), want, atol=1e-5)
    # Keras's own config builds an equal layer.
    clone = zoo_layers.MultiHeadAttention.from_config(ref.get_config())
    clone(q, v)
    clone.set_weights(ref.get_weights())
    np.testing.assert_allclose(np.asarray(clone(q, v, use_causal_mask=True)), want, atol=1e-5)


def test_use_causal_mask_is_causal_on_every_path():
    x = np.random.default_rng(3).standard_normal((2, 6, 8)).astype("float32")
    causal = zoo_layers.MultiHeadAttention(num_heads=2, key_dim=4, causal=True)
    want = np.asarray(causal(x))
    for options in ({}, {"chunk_size": 4}, {"dropout": 0.5}):
        layer = zoo_layers.MultiHeadAttention(num_heads=2, key_dim=4, **options)
        layer(x)
        layer.set_weights(causal.get_weights())
        np.testing.assert_allclose(np.asarray(layer(x, use_causal_mask=True)), want, atol=1e-5)
        assert np.max(np.abs(np.asarray(layer(x)) - want)) > 1e-3  # not causal without it


def test_regularizers_and_constraints_apply_like_keras():
    x = np.ones((1, 3, 4), "float32")
    args = dict(
        num_heads=1,
        key_dim=2,
        kernel_regularizer="l2",
        bias_regularizer="l1",
        kernel_constraint="non_neg",
        bias_constraint=keras.constraints.MaxNorm(1.0),
    )
    ref = keras.layers.MultiHeadAttention(**args)
    ours = zoo_layers.MultiHeadAttention(**args)
    ref(x, x)
    ours(x)
    ours.set_weights(ref.get_weights())
    np.testing.assert_allclose(float(sum(ours.losses)), float(sum(ref.losses)), rtol=1e-6)
    config = ours.get_config()
    assert config["kernel_constraint"]["class_name"] == "NonNeg"
    restored = zoo_layers.MultiHeadAttention.from_config(config)
    assert isinstance(restored.bias_constraint, keras.constraints.MaxNorm)
    kernels = [v for v in ours.trainable_variables if v.constraint is not None]
    assert len(kernels) == 8  # four kernels, four biases


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(output_shape=(3, 4)), "output_shape"),
        (dict(output_shape=4, output_dim=5), "output_shape"),
        (dict(attention_axes=(1, 2)), "attention_axes"),
        (dict(sliding_window=0), "sliding_window"),
        (dict(sliding_window=3, window=1), "sliding_window"),
        (dict(flash_attention=True), "flash_attention"),
        (dict(use_gate=True), "use_gate"),
    ],
)
def test_unsupported_keras_names_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        zoo_layers.MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)


def test_use_causal_mask_must_be_a_python_bool():
    layer = zoo_layers.MultiHeadAttention(num_heads=1, key_dim=2)
    with pytest.raises(ValueError, match="use_causal_mask"):
        layer(np.ones((1, 2, 4), "float32"), use_causal_mask="yes")
