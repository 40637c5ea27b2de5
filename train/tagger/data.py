"""Tagger data: build vocabularies, encode, batch."""

import collections
import math

import numpy as np
import tensorflow as tf

from zoo.tagger.encoding import PAD, UNK, word_keys
from zoo.tagger.model import pad_tokens


def normalised_keys(sentences):
    """Word keys (the encoder's own normalisation) for every token, sentence by sentence."""
    flat = [t for s in sentences for t in s.tokens]
    keys = (
        [k.decode("utf-8") for k in word_keys(tf.constant(flat, dtype=tf.string)).numpy()]
        if flat
        else []
    )
    out, i = [], 0
    for s in sentences:
        out.append(keys[i : i + len(s.tokens)])
        i += len(s.tokens)
    return out


def _by_count(items, skip=()):
    """The distinct `items` but `skip`, the most frequent first (ties in sorted order)."""
    counts = collections.Counter(items)
    return sorted((k for k in counts if k not in skip), key=lambda k: (-counts[k], k))


def build_vocab(data):
    """words/chars from training data only; tags from all splits (train ones first)."""
    keys = (k for sentence_keys in normalised_keys(data.train) for k in sentence_keys)
    words = [PAD, UNK] + _by_count(keys, (PAD, UNK, ""))
    chars = [PAD, UNK] + _by_count((c for s in data.train for t in s.tokens for c in t), (PAD, UNK))
    tags = _by_count(t for s in data.train for t in s.tags)
    extra = sorted(
        {t for split in (data.dev, data.test) for s in split for t in s.tags} - set(tags)
    )
    return words, chars, tags + extra


def word_tag_stats(data):
    """Training word key -> set of tags (for 'ambiguous' and 'unseen' accuracies)."""
    stats = collections.defaultdict(set)
    for keys, s in zip(normalised_keys(data.train), data.train):
        for k, t in zip(keys, s.tags):
            stats[k].add(t)
    return stats


class Encoded:
    """A split encoded once: per sentence word ids [T], char ids [T, C], tag ids [T]."""

    def __init__(self, encoder, sentences, tags, chunk=256):
        tag_index = {t: i for i, t in enumerate(tags)}
        self.sentences = sentences
        self.word_ids, self.char_ids, self.tag_ids = [], [], []
        for start in range(0, len(sentences), chunk):
            part = sentences[start : start + chunk]
            ids = encoder.encode(pad_tokens([s.tokens for s in part]))
            w, c = ids["word_ids"].numpy(), ids["char_ids"].numpy()
            for row, s in enumerate(part):
                n = len(s.tokens)
                self.word_ids.append(w[row, :n])
                self.char_ids.append(c[row, :n])
                self.tag_ids.append(np.array([tag_index[t] for t in s.tags], "int32"))
        self.lengths = np.array([len(s.tokens) for s in sentences])

    def __len__(self):
        return len(self.sentences)

    def batch(self, indices, multiple=8):
        # Padded to a multiple of 8: fewer distinct shapes to trace.
        width = int(math.ceil(max(self.lengths[i] for i in indices) / multiple) * multiple)
        b, c = len(indices), self.char_ids[indices[0]].shape[-1]
        word_ids = np.zeros((b, width), "int32")
        char_ids = np.zeros((b, width, c), "int32")
        tag_ids = np.zeros((b, width), "int32")
        weights = np.zeros((b, width), "float32")
        for row, i in enumerate(indices):
            n = self.lengths[i]
            word_ids[row, :n] = self.word_ids[i]
            char_ids[row, :n] = self.char_ids[i]
            tag_ids[row, :n] = self.tag_ids[i]
            weights[row, :n] = 1.0
        return {"word_ids": word_ids, "char_ids": char_ids}, tag_ids, weights
