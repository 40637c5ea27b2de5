"""Subword tokenization learned from the training text (SentencePiece).

The trainer is Google's `sentencepiece` (unigram or BPE for text, `char` for the
algorithmic tasks). Eagerly, the `sentencepiece` package tokenizes; in graphs
(`encode_tf`, `decode_tf`: an exported SavedModel signature, strings in, strings
out) `zoo.seq2seq.sentencepiece_graph` does, from core TensorFlow ops only, with
the same ids, so the stock `tensorflow_model_server` serves the model and a
loading process needs no `tensorflow_text`. (Models it cannot rebuild, e.g. BPE,
fall back to `tensorflow_text`'s `SentencepieceTokenizer`, whose kernels the
loading process must then register with `import tensorflow_text`.) The serialized
model travels inside the Keras model's config (base64), so a loaded `.keras`
file translates raw strings with nothing beside it.

Ids 0..3 are fixed: 0 = padding, 1 = unknown, 2 = begin (BOS), 3 = end (EOS).
"""

import base64
import io

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe", "char", "word")


def train_sentencepiece(
    texts,
    vocab_size=8000,
    model_type="unigram",
    normalization="nmt_nfkc",
    add_dummy_prefix=True,
):
    """Trains a SentencePiece model on an iterable of strings.

    Args:
        texts: list of str (source and target sentences for a joint vocabulary).
        vocab_size: int, the requested number of pieces (an upper bound: the
            trainer is told the limit is soft, so small corpora still train).
        model_type: one of `MODEL_TYPES`.
        normalization: SentencePiece normalization rule ("identity" keeps
            characters as they are, for algorithmic tasks).
        add_dummy_prefix: whether a leading "▁" is added (word-start marker).

    Returns:
        The serialized model proto (bytes).
    """
    import sentencepiece as spm

    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"`model_type` must be one of {MODEL_TYPES}. Received: model_type={model_type!r}"
        )
    if not isinstance(vocab_size, int) or vocab_size < 8:
        raise ValueError(f"`vocab_size` must be an int >= 8. Received: vocab_size={vocab_size!r}")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("cannot train a tokenizer on no text. Received: texts=[]")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts[:200000]),  # at most 200,000 sentences
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        character_coverage=1.0,
        normalization_rule_name=normalization,
        add_dummy_prefix=add_dummy_prefix,
        # A soft limit: a tiny corpus gets the pieces it has instead of an error.
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=2,
        # Keep digits apart so numbers are spelled digit by digit.
        split_digits=True,
    )
    return buffer.getvalue()


def cut(row):
    """Output ids before the first EOS."""
    row = [int(i) for i in row]
    return row[: row.index(EOS_ID)] if EOS_ID in row else row


def encode_proto(proto):
    return base64.b64encode(proto).decode("ascii")


def decode_proto(text):
    return base64.b64decode(text.encode("ascii"))


class Tokenizer:
    """SentencePiece model usable eagerly and in graphs.

    Args:
        proto: bytes, a serialized SentencePiece model (`train_sentencepiece`).

    Example:

    >>> proto = train_sentencepiece(["abc", "cab", "bca"] * 5, vocab_size=10,
    ...                             model_type="char", normalization="identity",
    ...                             add_dummy_prefix=False)
    >>> tok = Tokenizer(proto)
    >>> tok.decode(tok.encode(["cab"]))
    ['cab']
    """

    def __init__(self, proto):
        import sentencepiece as spm

        self.proto = bytes(proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self.proto)
        self._graph = None

    @property
    def vocabulary_size(self):
        return int(self._sp.get_piece_size())

    def pieces(self):
        return [self._sp.id_to_piece(i) for i in range(self.vocabulary_size)]

    def encode(self, texts):
        """list of str -> list of list of int (no BOS/EOS)."""
        return [list(ids) for ids in self._sp.encode(list(texts))]

    def encode_within(self, texts, limit):
        """`encode(texts)`, refusing (ValueError naming the input) a text of more
        than `limit` ids."""
        ids = self.encode(texts)
        for i, row in enumerate(ids):
            if len(row) > limit:
                raise ValueError(
                    f"input {i} has {len(row)} tokens, more than the model's {limit}: "
                    f"{texts[i][:60]!r}"
                )
        return ids

    def decode(self, ids):
        """list of id lists -> list of str; stops at EOS, skips padding/BOS."""
        return [self._sp.decode([i for i in cut(row) if i > BOS_ID]) for row in ids]

    def graph_tokenizer(self):
        """The in-graph tokenizer (a trackable with `tokenize` / `detokenize`):
        `sentencepiece_graph.build`'s core-op one when it supports the model
        (unigram and char models: everything this project trains), else
        `tensorflow_text.SentencepieceTokenizer` (which needs `tensorflow_text`
        wherever its graph runs)."""
        if self._graph is None:
            from zoo.seq2seq import sentencepiece_graph

            try:
                self._graph = sentencepiece_graph.build(self.proto)
            except NotImplementedError:
                import tensorflow as tf
                import tensorflow_text as tf_text

                self._graph = tf_text.SentencepieceTokenizer(model=self.proto, out_type=tf.int32)
        return self._graph

    def encode_tf(self, texts, length):
        """string [B] -> int32 [B, length] ids padded with 0 (in-graph), and
        int32 [B] token counts before padding (to detect over-long inputs)."""
        import tensorflow as tf

        ragged = tf.cast(self.graph_tokenizer().tokenize(texts), tf.int32)
        counts = tf.cast(ragged.row_lengths(), tf.int32)
        batch = tf.shape(texts)[0]
        dense = ragged[:, :length].to_tensor(default_value=PAD_ID, shape=tf.stack([batch, length]))
        return dense, counts

    def decode_tf(self, ids):
        """int32 [B, L] -> string [B]: cut at the first EOS, drop pad/BOS (in-graph)."""
        import tensorflow as tf

        ids = tf.convert_to_tensor(ids, tf.int32)
        is_eos = tf.cast(tf.equal(ids, EOS_ID), tf.int32)
        before_eos = tf.equal(tf.cumsum(is_eos, axis=1, exclusive=False), 0)
        keep = tf.logical_and(before_eos, ids > BOS_ID)
        ragged = tf.ragged.boolean_mask(ids, keep)
        return self.graph_tokenizer().detokenize(ragged)
