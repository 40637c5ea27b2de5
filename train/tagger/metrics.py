"""Token-level tagging accuracy: all words, ambiguous words, unseen words.

Padding never counts, and non-word rows (multiword ranges, empty nodes) never reach the
data. "Ambiguous": the word (normalised key) had two or more tags in training.
"Unseen": the word never occurred in training.
"""

import tensorflow as tf

from train.tagger.data import Batches, normalised_keys


def predict_split(model, encoded, batch_size=64):
    """Predicted tag ids per sentence (lists of int arrays), in the split's order."""
    batches = Batches(encoded, batch_size, shuffle=False)
    preds = [None] * len(encoded)
    for k in range(len(batches)):
        x, _, _ = batches[k]
        probs = model.core(x, training=False)
        ids = tf.argmax(probs, axis=-1, output_type=tf.int32).numpy()
        for row, i in enumerate(batches.batches[k]):
            preds[i] = ids[row, : encoded.lengths[i]]
    return preds


def accuracies(model, encoded, word_tags):
    preds = predict_split(model, encoded)
    keys = normalised_keys(encoded.sentences)
    total = {"all": [0, 0], "ambiguous": [0, 0], "unseen": [0, 0]}
    for pred, gold, sent_keys in zip(preds, encoded.tag_ids, keys):
        for p, g, k in zip(pred, gold, sent_keys):
            hit = int(p == g)
            groups = ["all"]
            if k not in word_tags:
                groups.append("unseen")
            elif len(word_tags[k]) > 1:
                groups.append("ambiguous")
            for group in groups:
                total[group][0] += hit
                total[group][1] += 1
    out = {}
    for group, (hits, count) in total.items():
        out[f"{group}_accuracy"] = hits / count if count else None
        out[f"{group}_tokens"] = count
    return out
