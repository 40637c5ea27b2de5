"""The tagger's id-level core networks: one input pipeline, one head, four context models.

    word_ids [B, T] --(word dropout, embedding)--------------------\
    char_ids [B, T, C] --(embedding, conv over characters, max)-----+-> features [B, T, F]
    features --(context: fc | window | bilstm | attention)--> [B, T, H] --Dense softmax--> tags

Every tensor stays rank <= 4 and the character CNN is a Conv2D with a (1, k) kernel, so
the core converts to TFLite builtins without 5-D tensors or reshapes of the batch.
"""

import keras
from keras import ops

from layers import LayerNorm, TokenEmbedding, TransformerEncoderBlock
from zoo.tagger.layers import Presence, WordDropout


def char_features(char_ids, num_chars, char_dim, char_filters, char_kernels):
    chars = TokenEmbedding(num_chars, char_dim, name="char_embedding")(char_ids)
    present = ops.expand_dims(Presence(num_chars, name="char_presence")(char_ids), -1)
    pooled = []
    for k in char_kernels:
        conv = keras.layers.Conv2D(
            char_filters, (1, k), padding="same", activation="relu", name=f"char_conv_{k}"
        )(chars)
        # ReLU output is >= 0, so zeroing padded characters keeps them out of the max.
        pooled.append(ops.max(conv * present, axis=2))
    return pooled[0] if len(pooled) == 1 else keras.layers.Concatenate(name="char_concat")(pooled)


def build_core(arch, num_words, num_chars, num_tags, max_chars, cfg):
    """Returns the functional id-level model of `arch` (one of config.ARCHS, checked by
    the Tagger). `cfg` holds the tagger's hyper-parameters."""
    word_ids = keras.Input(shape=(None,), dtype="int32", name="word_ids")
    char_ids = keras.Input(shape=(None, max_chars), dtype="int32", name="char_ids")
    presence = Presence(num_words, name="word_presence")(word_ids)
    mask = ops.greater(presence, 0.5)
    fmask = ops.expand_dims(presence, -1)

    dropped = WordDropout(cfg["word_dropout"], name="word_dropout")(word_ids)
    words = TokenEmbedding(num_words, cfg["word_dim"], name="word_embedding")(dropped)
    chars = char_features(
        char_ids, num_chars, cfg["char_dim"], cfg["char_filters"], cfg["char_kernels"]
    )
    x = keras.layers.Concatenate(name="features")([words, chars])
    x = keras.layers.Dropout(cfg["dropout"], name="features_dropout")(x)
    x = x * ops.cast(fmask, x.dtype)

    hidden = cfg["hidden_dim"]
    if arch == "fc":
        x = keras.layers.Dense(hidden, activation="relu", name="fc")(x)
        x = keras.layers.Dropout(cfg["dropout"], name="fc_dropout")(x)
    elif arch == "window":
        x = keras.layers.Conv1D(
            hidden, cfg["window"], padding="same", activation="relu", name="window_conv"
        )(x)
        x = keras.layers.Dropout(cfg["dropout"], name="window_dropout")(x)
    elif arch == "bilstm":
        for i in range(cfg["num_layers"]):
            x = keras.layers.Bidirectional(
                keras.layers.LSTM(hidden // 2, return_sequences=True), name=f"bilstm_{i}"
            )(x, mask=mask)
            x = keras.layers.Dropout(cfg["dropout"], name=f"bilstm_dropout_{i}")(x)
    else:  # "attention" (Tagger checks `arch` against config.ARCHS)
        # The 0/1 float presence, not the boolean mask: in an int8 model a
        # bool -> float cast would run outside the integer kernels.
        x = _attention_context(x, presence, fmask, cfg)

    probs = keras.layers.Dense(num_tags, activation="softmax", dtype="float32", name="tags")(x)
    return keras.Model({"word_ids": word_ids, "char_ids": char_ids}, probs, name=f"{arch}_core")


def _attention_context(x, mask, fmask, cfg):
    d = cfg["hidden_dim"]
    x = keras.layers.Dense(d, name="attention_in")(x)
    for i in range(cfg["num_layers"]):
        if cfg["conv_kernel"]:
            # A residual local convolution before each attention block gives every token
            # its neighbours cheaply (the locality a BiLSTM has built in); attention then
            # adds the long-range context.
            h = LayerNorm(epsilon=1e-5, name=f"conv_norm_{i}")(x)
            h = keras.layers.Conv1D(
                d, cfg["conv_kernel"], padding="same", activation="gelu", name=f"conv_{i}"
            )(h * ops.cast(fmask, h.dtype))
            x = x + keras.layers.Dropout(cfg["dropout"], name=f"conv_dropout_{i}")(h)
        x = TransformerEncoderBlock(
            num_heads=cfg["num_heads"],
            intermediate_dim=2 * d,
            dropout=cfg["dropout"],
            rotary=cfg["rotary"],
            window=cfg["attention_window"],
            name=f"encoder_{i}",
        )(x, mask=mask, return_attention_scores=True)
        x = x[0]  # the scores stay reachable as the block's output[1] (Tagger.attention_scores)
    x = LayerNorm(epsilon=1e-5, name="attention_out_norm")(x)
    return x
