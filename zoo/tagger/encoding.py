"""Token -> id rules of the tagger, written once in TensorFlow ops.

The same `TokenEncoder` runs eagerly in `Tagger.tag` and inside exported `tf.function`s
(SavedModel serving raw text); `zoo.lite.LiteTagger` applies its rules in NumPy in front
of a TFLite model (`zoo.lite`, `python -m zoo.tag`), so training, serving and the phone
agree on every id.
"""

import keras
import tensorflow as tf

from layers.validation import check_int

PAD = "<pad>"
UNK = "<unk>"


def word_keys(tokens):
    """Normalised word-vocabulary keys: lower case (UTF-8 aware), every digit -> "0"."""
    lowered = tf.strings.lower(tokens, encoding="utf-8")
    return tf.strings.regex_replace(lowered, "[0-9]", "0")


def _check_vocab(name, items):
    items = list(items)
    if len(items) < 2 or items[0] != PAD or items[1] != UNK:
        raise ValueError(
            f"`{name}` must start with {PAD!r}, {UNK!r}. Received: {name}={items[:3]!r}..."
        )
    rest = items[2:]
    if len(set(rest)) != len(rest) or "" in rest or PAD in rest or UNK in rest:
        raise ValueError(
            f"`{name}` entries must be unique, non-empty strings after {PAD!r}, {UNK!r}"
        )
    return items


@keras.saving.register_keras_serializable(package="zoo")
class TokenEncoder(keras.layers.Layer):
    """Maps string tokens to word ids and character ids.

    Word id: `words.index(word_keys(token))`, 1 if unknown, 0 for the padding token "".
    Character ids: one per Unicode character of the token as written (case kept), 1 if
    unknown, truncated to `max_chars` and padded with 0.

    Args:
        words: list of str, word vocabulary; `words[0] == "<pad>"`, `words[1] == "<unk>"`.
        chars: list of str, character vocabulary with the same two first entries.
        max_chars: positive int, characters kept per token.

    Call arguments (`encode`):
        tokens: string tensor `[batch, time]` padded with "" (or a `tf.RaggedTensor`).

    Returns:
        dict with "word_ids" int32 `[batch, time]` and "char_ids" int32
        `[batch, time, max_chars]`.

    Example:

    >>> enc = TokenEncoder(["<pad>", "<unk>", "saw"], ["<pad>", "<unk>", "s", "a"], 4)
    >>> ids = enc.encode(tf.constant([["Saw", "zz", ""]]))
    >>> ids["word_ids"].numpy().tolist()
    [[2, 1, 0]]
    """

    def __init__(self, words, chars, max_chars, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.words = _check_vocab("words", words)
        self.chars = _check_vocab("chars", chars)
        self.max_chars = check_int("max_chars", max_chars)
        self.word_lookup = keras.layers.StringLookup(
            vocabulary=self.words[2:], mask_token="", oov_token=UNK, name="word_lookup"
        )
        self.char_lookup = keras.layers.StringLookup(
            vocabulary=self.chars[2:], mask_token="", oov_token=UNK, name="char_lookup"
        )
        self.built = True

    def encode(self, tokens):
        if isinstance(tokens, tf.RaggedTensor):
            tokens = tokens.to_tensor(default_value="")
        tokens = tf.convert_to_tensor(tokens, dtype=tf.string)
        word_ids = tf.cast(self.word_lookup(word_keys(tokens)), tf.int32)
        # Padding "" stays 0 after normalisation because it is the mask token.
        chars = tf.strings.unicode_split(tokens, "UTF-8", errors="replace")
        char_ids = tf.cast(self.char_lookup(chars), tf.int32)
        shape = tf.concat([tf.shape(tokens), [self.max_chars]], axis=0)
        char_ids = char_ids.to_tensor(default_value=0, shape=shape)
        return {"word_ids": word_ids, "char_ids": char_ids}

    def call(self, tokens):
        return self.encode(tokens)

    def get_config(self):
        config = super().get_config()
        config.update(words=self.words, chars=self.chars, max_chars=self.max_chars)
        return config
