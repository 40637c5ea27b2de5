"""Token-level tagging accuracy: all words, ambiguous words, unseen words.

Padding never counts, and non-word rows (multiword ranges, empty nodes) never reach the
data. "Ambiguous": the word (normalised key) had two or more tags in training.
"Unseen": the word never occurred in training.
"""

import tensorflow as tf

from train.buckets import Batches
from train.tagger.data import normalised_keys


def accuracies(model, encoded, word_tags):
    batches = Batches(encoded, 64)
    keys = normalised_keys(encoded.sentences)
    total = {"all": [0, 0], "ambiguous": [0, 0], "unseen": [0, 0]}
    for index, (x, gold, _) in zip(batches.rows, batches):
        probs = model.core(x, training=False)
        predicted = tf.argmax(probs, axis=-1, output_type=tf.int32).numpy()
        for row, i in enumerate(index):  # keys[i]: the sentence's words, not its padding
            for p, g, key in zip(predicted[row], gold[row], keys[i]):
                hit = int(p == g)
                groups = ["all"]
                if key not in word_tags:
                    groups.append("unseen")
                elif len(word_tags[key]) > 1:
                    groups.append("ambiguous")
                for group in groups:
                    total[group][0] += hit
                    total[group][1] += 1
    out = {}
    for group, (hits, count) in total.items():
        out[f"{group}_accuracy"] = hits / count if count else None
        out[f"{group}_tokens"] = count
    return out
