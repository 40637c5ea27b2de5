"""Evaluation of a SAGAN generator in the frozen classifier's feature space.

Fixed sample counts: `n` generated images (classes in turn for conditional
models, a fixed noise seed), `n` real training images (the reference) and `n`
real test images. `fid` = FID(generated, reference); `fid_floor` = FID(real
test, reference), the distance a perfect generator would still show with `n`
samples. Same for `kid` / `kid_floor`.
"""

import numpy as np

from train.sagan.fid import frechet_distance, kernel_inception_distance
from train.sagan.fid_classifier import features_and_outputs, to_float


class Evaluator:
    """Holds the reference features so each evaluation only embeds generated images of
    the generator `model_cfg` describes; `seed` draws the real images."""

    def __init__(self, classifier, data, n, seed, model_cfg):
        rng = np.random.default_rng(seed)
        self.n = int(min(n, len(data.train), len(data.test)))
        self.classifier, self.class_names = classifier, data.class_names
        self.latent_dim, self.num_classes = model_cfg["latent_dim"], model_cfg["num_classes"]
        reference = to_float(data.train[rng.choice(len(data.train), self.n, replace=False)])
        test = to_float(data.test[rng.choice(len(data.test), self.n, replace=False)])
        self.ref_features, _ = features_and_outputs(classifier, reference)
        self.test_features, test_out = features_and_outputs(classifier, test)
        self.real_consistent = float(np.mean(test_out["consistent"][:, 0] > 0.5))

    def _kid(self, features):
        return round(kernel_inception_distance(features, self.ref_features), 5)

    def evaluate(self, generator, seed, quick=False):
        """FID, KID, class accuracy (per class too) and consistency of the generator, and
        the floors; `quick`: the per-epoch signal (no KID), its keys ending in _quick, with
        the worst-drawn class's accuracy (--keep best prefers epochs that draw every class)."""
        n, batch = self.n, 128
        noise = np.random.default_rng(seed).standard_normal((n, self.latent_dim)).astype(np.float32)
        labels = (np.arange(n) % (self.num_classes or 1)).astype(np.int32)  # classes in turn
        images = []
        for i in range(0, n, batch):
            feed = {"noise": noise[i : i + batch]}
            if self.num_classes:
                feed["label"] = labels[i : i + batch]
            images.append(np.asarray(generator.predict_on_batch(feed)))
        features, out = features_and_outputs(self.classifier, np.concatenate(images))
        fid = round(frechet_distance(features, self.ref_features), 4)
        accuracy, per_class = None, {}
        if self.num_classes:
            hits = np.argmax(out["class"], axis=-1) == labels
            accuracy = round(float(np.mean(hits)), 4)
            per_class = {
                self.class_names[k]: round(float(np.mean(hits[labels == k])), 4)
                for k in range(self.num_classes)
                if np.any(labels == k)
            }
        consistent = round(float(np.mean(out["consistent"][:, 0] > 0.5)), 4)
        if quick:
            return {
                "fid_quick": fid,
                "class_accuracy_quick": accuracy,
                "class_min_quick": min(per_class.values()) if per_class else None,
                "consistent_quick": consistent,
            }
        metrics = {
            "fid": fid,
            "kid": self._kid(features),
            "fid_floor": round(frechet_distance(self.test_features, self.ref_features), 4),
            "kid_floor": self._kid(self.test_features),
            "class_accuracy": accuracy,
            "consistent": consistent,
            "real_consistent": round(self.real_consistent, 4),
            "eval_samples": self.n,
        }
        if self.num_classes:
            metrics["class_accuracy_per_class"] = per_class
        return metrics
