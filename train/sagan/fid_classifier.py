"""The frozen evaluation classifier whose feature space FID and KID are measured in.

Trained on the run's real training images only. Two heads on one trunk:
- `class`: the image's class (what `class_accuracy` of generated images uses);
- `consistent`: whether the image is whole or spliced from the left half of one
  real image and the right half of another. Spliced negatives need no labels
  and work on any data set; the head makes the features sensitive to whether
  the two halves of an image agree (mirrored shapes, matching corners), which a
  class head alone would ignore, so FID sees long-range structure.
The trunk keeps positions (stride-2 convs down to 4x4, then flatten), the
`features` layer (128 ReLU units) is the FID feature space. The run keeps it as
`classifier.keras` and as its `classifier` checkpoint, which --resume reads.
"""

import os
import sys

import numpy as np

FEATURES = "features"
CHECKPOINT = "classifier"


def to_float(images):
    """uint8 [0, 255] -> float32 [-1, 1] (the generator's range)."""
    return np.asarray(images, np.float32) / 127.5 - 1.0


def build_classifier(image_size, channels, num_classes, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    image = keras.Input((image_size, image_size, channels), name="image")
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(image)
    filters, side = 32, image_size
    while side > 4:
        filters = min(128, filters * 2)
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", activation="relu")(x)
        side //= 2
    x = keras.layers.Flatten()(x)
    features = keras.layers.Dense(128, activation="relu", name=FEATURES)(x)
    outputs = {
        "class": keras.layers.Dense(max(num_classes, 1), activation="softmax", name="class")(
            features
        ),
        "consistent": keras.layers.Dense(1, activation="sigmoid", name="consistent")(features),
    }
    return keras.Model(image, outputs, name="fid_classifier")


def splice(images):
    """Left half of each image, right half of the next one (a whole batch rolled by 1)."""
    import tensorflow as tf

    half = images.shape[2] // 2
    return tf.concat([images[:, :, :half], tf.roll(images, 1, axis=0)[:, :, half:]], axis=2)


def _dataset(images, labels, batch_size, seed):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)

    def both(x, y):
        x = tf.cast(x, tf.float32) / 127.5 - 1.0
        n = tf.shape(x)[0]
        xs = tf.concat([x, splice(x)], axis=0)
        ones, zeros = tf.ones((n,)), tf.zeros((n,))
        targets = {
            "class": tf.concat([y, y], 0),
            "consistent": tf.concat([ones, zeros], 0)[:, None],
        }
        weights = {"class": tf.concat([ones, zeros], 0), "consistent": tf.ones((2 * n,))}
        return xs, targets, weights

    return ds.batch(batch_size, drop_remainder=True).map(both).prefetch(2)


def train_classifier(data, epochs, seed):
    """Trains the classifier on `data.train`; returns (model, its report: the accuracy of
    both heads on the real test images and spliced versions)."""
    import keras
    import tensorflow as tf

    model = build_classifier(data.image_size, data.channels, data.num_classes, seed)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss={"class": "sparse_categorical_crossentropy", "consistent": "binary_crossentropy"},
        weighted_metrics={"class": ["accuracy"], "consistent": ["binary_accuracy"]},
    )
    batch = min(64, max(2, len(data.train) // 2))
    model.fit(_dataset(data.train, data.train_labels, batch, seed), epochs=epochs, verbose=0)
    model.trainable = False
    x = to_float(data.test)
    out = model.predict(x, batch_size=256, verbose=0)
    class_acc = float(np.mean(np.argmax(out["class"], -1) == data.test_labels))
    spliced = model.predict(np.asarray(splice(tf.constant(x))), batch_size=256, verbose=0)
    consistent = float(np.mean(out["consistent"][:, 0] > 0.5))
    rejected = float(np.mean(spliced["consistent"][:, 0] <= 0.5))
    return model, {
        "classifier_test_accuracy": round(class_acc, 4),
        "classifier_test_consistent": round(consistent, 4),
        "classifier_test_spliced_rejected": round(rejected, 4),
    }


def features_and_outputs(model, images, batch_size=256):
    """(features [N, 128], class probabilities, consistency) for float images in [-1, 1]."""
    import keras

    both = keras.Model(model.input, [model.get_layer(FEATURES).output, model.output])
    feats, outs = [], {"class": [], "consistent": []}
    for i in range(0, len(images), batch_size):
        f, o = both(images[i : i + batch_size], training=False)
        feats.append(np.asarray(f))
        for k in outs:
            outs[k].append(np.asarray(o[k]))
    return np.concatenate(feats), {k: np.concatenate(v) for k, v in outs.items()}


def save_cached(model, report, out):
    """The classifier as the run's `classifier` checkpoint (its test report in the
    record), classifier.keras and classifier.json."""
    from train import checkpoint
    from zoo import atomic

    checkpoint.save(
        os.path.join(out, "checkpoints"),
        {"model": model.variables},
        {"step": 0, "report": report},
        name=CHECKPOINT,
        keep=1,
        models=(model,),
    )
    atomic.save_model(model, os.path.join(out, "classifier.keras"))
    atomic.write_json(os.path.join(out, "classifier.json"), report)


def get_classifier(out, data, train_cfg, classifier=None):
    """The run's frozen classifier and its report: given (compare's pair), the run's
    `classifier` checkpoint, or trained now. A damaged checkpoint (truncated, corrupted)
    is one line on stderr, and the classifier is trained again from the same data and seed."""
    from train import checkpoint

    seed, epochs = train_cfg["data_seed"], train_cfg["classifier_epochs"]
    if classifier is None:
        path, record, damaged = checkpoint.latest(os.path.join(out, "checkpoints"), CHECKPOINT)
        if path is not None:
            model = build_classifier(data.image_size, data.channels, data.num_classes, seed)
            checkpoint.restore(path, {"model": model.variables}, models=(model,))
            model.trainable = False
            return model, record["report"]
        if damaged:
            print(f"{damaged[0][1]}; training the evaluation classifier again", file=sys.stderr)
        print(
            f"training the evaluation classifier ({epochs} epochs)...", file=sys.stderr, flush=True
        )
        classifier = train_classifier(data, epochs=epochs, seed=seed)
    save_cached(*classifier, out)
    return classifier
