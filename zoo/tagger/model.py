"""Part-of-speech tagger: `zoo.build("tagger", words=..., chars=..., tags=..., arch=...)`.

The lecture's example: in "I saw a saw" a per-word classifier ("fc") cannot tag the two
"saw"s differently, a fixed window ("window") sees only its neighbours, and a BiLSTM or
self-attention ("attention", the default) sees the whole sentence.
"""

import keras
import numpy as np
import tensorflow as tf

from layers.validation import check_choice, check_int, check_rate
from zoo.tagger.archs import build_core
from zoo.tagger.config import ARCH_DEFAULTS, ARCHS, DEFAULTS
from zoo.tagger.encoding import TokenEncoder


@keras.saving.register_keras_serializable(package="zoo")
class Tagger(keras.Model):
    """Sequence tagger from words + characters to one tag per token.

    Args:
        words: list of str, word vocabulary (`words[0] == "<pad>"`, `words[1] == "<unk>"`,
            other entries are normalised keys, see `zoo.tagger.encoding.word_keys`).
        chars: list of str, character vocabulary with the same two first entries.
        tags: list of str, tag names (index = class id).
        arch: "attention" (default), "fc", "window" or "bilstm".
        max_chars: int, characters per token the character encoder sees.
        max_len: int, longest sentence `tag` accepts (the positional range trained).
        **hparams: see `DEFAULTS` (word_dim, char_dim, char_filters, char_kernels,
            hidden_dim, num_layers, num_heads, dropout, word_dropout, window, conv_kernel,
            rotary, attention_window).

    Call arguments:
        inputs: dict with "word_ids" int32 `[B, T]` and "char_ids" int32 `[B, T, max_chars]`.

    Returns:
        float32 `[B, T, len(tags)]` softmax probabilities (`call == core`).

    Example:

    >>> t = Tagger(["<pad>", "<unk>", "i", "saw", "a"], ["<pad>", "<unk>", "I", "s", "a", "w"],
    ...            ["PRON", "VERB", "DET", "NOUN"], arch="fc")
    >>> len(t.tag("I saw a saw")[0])
    4
    """

    def __init__(self, words, chars, tags, arch="attention", max_chars=16, max_len=256, **hparams):
        name = hparams.pop("name", "tagger")
        for key in ("trainable", "dtype"):
            hparams.pop(key, None)
        super().__init__(name=name)
        check_choice("arch", arch, ARCHS)
        unknown = set(hparams) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"unknown tagger hyper-parameter(s): {sorted(unknown)}")
        tags = list(tags)
        if not tags or len(set(tags)) != len(tags):
            raise ValueError(
                f"`tags` must be a non-empty list of unique names. Received: tags={tags!r}"
            )
        cfg = dict(DEFAULTS)
        cfg.update(ARCH_DEFAULTS[arch])
        cfg.update({k: v for k, v in hparams.items() if v is not None})
        cfg["char_kernels"] = [int(k) for k in cfg["char_kernels"]]
        for key in (
            "word_dim",
            "char_dim",
            "char_filters",
            "hidden_dim",
            "num_layers",
            "num_heads",
            "window",
        ):
            cfg[key] = check_int(key, cfg[key])
        for key in ("dropout", "word_dropout"):
            check_rate(key, cfg[key])
        self.arch = arch
        self.max_chars = check_int("max_chars", max_chars)
        self.max_len = check_int("max_len", max_len)
        self.hparams = cfg
        self.encoder = TokenEncoder(list(words), list(chars), self.max_chars, name="encoder")
        self.words = self.encoder.words
        self.chars = self.encoder.chars
        self.tags = tags
        self.core = build_core(
            arch, len(self.words), len(self.chars), len(tags), self.max_chars, cfg
        )
        self.built = True

    def call(self, inputs, training=None):
        return self.core(inputs, training=training)

    def encode_tf(self, tokens):
        """String tokens `[B, T]` (padded with "", or ragged) -> {"word_ids", "char_ids"}."""
        return self.encoder.encode(tokens)

    def predict_ids(self, tokens):
        """Tag ids `[B, T]` (int32) for string tokens `[B, T]`, in TF ops."""
        probs = self.core(self.encode_tf(tokens), training=False)
        return tf.argmax(probs, axis=-1, output_type=tf.int32)

    def tag(self, sentences, batch_size=64):
        """Tags sentences: raw strings (split on whitespace) or lists of tokens.

        A single string is one sentence. Returns a list (one per sentence) of lists of
        (token, tag) pairs.
        """
        token_lists = split_sentences(sentences)
        for tokens in token_lists:
            if len(tokens) > self.max_len:
                raise ValueError(
                    f"sentence has {len(tokens)} tokens, more than max_len={self.max_len}"
                )
        result = []
        for start in range(0, len(token_lists), batch_size):
            chunk = token_lists[start : start + batch_size]
            ids = self.predict_ids(pad_tokens(chunk)).numpy()
            for tokens, row in zip(chunk, ids):
                result.append([(tok, self.tags[i]) for tok, i in zip(tokens, row)])
        return result

    def attention_scores(self, tokens):
        """Attention weights for one sentence: list (one per block) of `[heads, T, T]` arrays.

        Only the "attention" arch has them; the others return an empty list.
        """
        blocks = [layer for layer in self.core.layers if layer.name.startswith("encoder_")]
        if not blocks:
            return []
        probe = keras.Model(self.core.inputs, [block.output[1] for block in blocks])
        scores = probe(self.encode_tf(pad_tokens([list(tokens)])), training=False)
        if not isinstance(scores, (list, tuple)):
            scores = [scores]
        return [np.asarray(s)[0] for s in scores]

    def get_config(self):
        config = {
            "name": self.name,
            "words": self.words,
            "chars": self.chars,
            "tags": self.tags,
            "arch": self.arch,
            "max_chars": self.max_chars,
            "max_len": self.max_len,
        }
        config.update(self.hparams)
        return config


def split_sentences(sentences):
    if isinstance(sentences, str):
        sentences = [sentences]
    return [s.split() if isinstance(s, str) else [str(t) for t in s] for s in sentences]


def pad_tokens(token_lists):
    """List of token lists -> dense tf.string `[B, T]` padded with ""."""
    width = max([len(t) for t in token_lists] + [1])
    rows = [list(t) + [""] * (width - len(t)) for t in token_lists]
    return tf.constant(rows, dtype=tf.string)
