"""Export plugin for SAGAN generators (config kind "sagan", `zoo.build("sagan_generator")`).

SavedModel signatures (TF Serving):
  serving_default(noise float32 [B, latent_dim], label int32 [B])
      -> image float32 [B, S, S, C] in [0, 1]      (the TFLite model's contract)
  generate(noise, label) -> image uint8 [B, S, S, C] (ready to display / encode)
(`label` only for class-conditional generators.) An empty batch gives no images;
out-of-range labels, mismatched batches and non-finite noise are refused in our
words (docs/deploy.md, "What a signature answers").

TFLite: the float [0, 1] image; `--static-shape` gives batch 1 with every shape
static, which is what the mobile GPU delegate needs. The uint8 output stays in
the SavedModel: CAST float32 -> uint8 is not a GPU-delegate op, so the app
scales by 255 itself. The generator's conditional batch norm uses moving
statistics at inference, so batch-1 output equals the batch output row for row.
"""

import numpy as np

from export.kinds import Endpoint, ExportKind, assert_ids_in_range, checked, cut_to, pad_empty


class SaganKind(ExportKind):
    name = "sagan"
    expected = "a SAGAN generator"

    def matches(self, model):
        return getattr(model, "name", "") == "sagan_generator"

    def _dims(self, source):
        m = self.model(source)
        inputs = m.input if isinstance(m.input, dict) else {"noise": m.input}
        latent_dim = int(inputs["noise"].shape[-1])
        conditional = "label" in inputs
        num_classes = source.config.get("model", {}).get("num_classes")
        if conditional and not num_classes:
            num_classes = int(m.get_layer("up_8").num_classes)
        return latent_dim, conditional, num_classes

    def core_specs(self, source, static_length=None):
        import tensorflow as tf

        latent_dim, conditional, _ = self._dims(source)
        batch = 1 if static_length is not None else None
        specs = [tf.TensorSpec([batch, latent_dim], tf.float32, name="noise")]
        if conditional:
            specs.append(tf.TensorSpec([batch], tf.int32, name="label"))
        return specs

    def core_fn(self, source, static=False):
        import tensorflow as tf

        m = self.model(source)
        _, conditional, _ = self._dims(source)

        def fn(noise, label=None):
            feed = {"noise": noise, "label": label} if conditional else {"noise": noise}
            image = m(feed, training=False)
            # tanh [-1, 1] -> [0, 1]; the clip keeps fp16 round-off inside the range.
            return {"image": tf.clip_by_value(image * 0.5 + 0.5, 0.0, 1.0)}

        return fn

    def serving_endpoints(self, source):
        import tensorflow as tf

        specs = self.core_specs(source)
        unchecked = self.core_fn(source)
        _, conditional, num_classes = self._dims(source)

        def core(noise, label=None):
            noise = tf.debugging.check_numerics(noise, "noise must be finite (no NaN or inf)")
            if conditional:
                # An out-of-range label would read past the class-embedding table.
                label = assert_ids_in_range(
                    label, num_classes, "label", "the number of classes", padding=False
                )
                noise = checked(
                    noise,
                    tf.debugging.assert_equal(
                        tf.shape(noise)[0],
                        tf.shape(label)[0],
                        message="noise and label must have the same number of rows",
                    ),
                )
            # An empty batch runs as one row and is cut back (pad_empty says why).
            inputs = [pad_empty(noise)] + ([pad_empty(label)] if conditional else [])
            return cut_to(unchecked(*inputs), tf.shape(noise)[0])

        # Graph functions, so the proof compares the same optimised graph the SavedModel
        # runs: eager and graph float results can differ in the last bit, and a uint8
        # rounding at .5 would then flip.
        core = tf.function(core)

        @tf.function
        def generate(*args):
            image = core(*args)["image"]
            return {"image": tf.cast(tf.round(image * 255.0), tf.uint8)}

        example = self.sample_inputs(source, 2, specs=specs)
        return [
            Endpoint(
                "serving_default",
                core,
                specs,
                example,
                "noise (and label) -> image float32 in [0, 1] (the TFLite contract)",
            ),
            Endpoint(
                "generate",
                generate,
                specs,
                example,
                "noise (and label) -> image uint8 [B, S, S, C]",
            ),
        ]

    def sample_inputs(self, source, n, specs):
        latent_dim, conditional, num_classes = self._dims(source)
        calib = source.calibration()
        if calib is not None and "noise" in calib and len(calib["noise"]) >= n:
            noise = np.asarray(calib["noise"][:n], np.float32)
        else:
            noise = np.random.default_rng(0).standard_normal((n, latent_dim)).astype(np.float32)
        out = {"noise": noise}
        if conditional:
            out["label"] = (np.arange(n) % max(int(num_classes or 1), 1)).astype(np.int32)
        return out

    def sidecar(self, source, static_length=None):
        latent_dim, conditional, num_classes = self._dims(source)
        return {
            "kind": "sagan",
            "latent_dim": latent_dim,
            "num_classes": num_classes,
            "class_names": source.config.get("class_names") if conditional else None,
            "image_shape": [int(d) for d in self.model(source).output.shape[1:]],
            "noise": "standard normal, float32 [batch, latent_dim]",
            "output": "image float32 [batch, S, S, C] in [0, 1]; multiply by 255 for uint8",
        }

    # ------------------------------------------------------------ bundle
    intended_use = (
        "Generating images like the training data's (see data), per class for a "
        "class-conditional generator; demonstrations and data augmentation research."
    )
    limitations = (
        "Samples can be implausible or repeat training images; FID/KID are measured in "
        "the run's own classifier's feature space, not Inception's."
    )
    card_keys = (
        "fid",
        "kid",
        "fid_floor",
        "kid_floor",
        "class_accuracy",
        "consistent",
        "real_consistent",
        "eval_samples",
    )

    def labels(self, source):
        _, conditional, num_classes = self._dims(source)
        if not conditional:
            return None
        names = source.config.get("class_names") or []
        return (
            [str(n) for n in names]
            if len(names) == num_classes
            else [str(i) for i in range(num_classes)]
        )

    def preprocessing(self, source, refs):
        from zoo.tasks import ImageGenerator

        latent_dim, conditional, num_classes = self._dims(source)
        inputs = {
            "noise": {
                "dtype": "float32",
                "shape": ["batch", latent_dim],
                "distribution": "standard normal, independent per value, one row per image",
            }
        }
        if conditional:
            inputs["label"] = {
                "dtype": "int32",
                "shape": ["batch"],
                "range": [0, num_classes - 1],
                "labels": {"file": refs["labels"], "id": "line number, from 0"},
            }
        # Test vectors by this project's own rule (zoo.load's / zoo.lite's `generate`):
        # the noise and labels it feeds for some class ids (or a number of images).
        fed = {}

        def run(noise, labels):
            fed.update(noise=noise.tolist(), label=labels.tolist())
            return noise

        names = self.labels(source) or []
        generator = ImageGenerator(run, latent_dim, num_classes, names, "bundle")
        vectors = []
        for seed, picked in ((0, [0]), (7, list(range(min(num_classes or 2, 3)))[::-1])):
            if conditional:
                class_ids = [names[i] for i in picked]
                generator.generate(class_ids, seed=seed)
                vectors.append(
                    dict(seed=seed, noise=fed["noise"], class_ids=class_ids, label=fed["label"])
                )
            else:
                generator.generate(num_images=len(picked), seed=seed)
                vectors.append(dict(seed=seed, noise=fed["noise"], num_images=len(picked)))
        return {
            "input": "class names or ids (conditional) or a number of images, and a seed",
            "inputs": inputs,
            "seeded_noise": "numpy.random.default_rng(seed).standard_normal((n, latent_dim))"
            ".astype(float32), n = the number of images (any N(0, 1) noise is valid; this "
            "rule reproduces zoo.load's and zoo.lite's images)",
            "output": {
                "name": "image",
                "dtype": "float32",
                "shape": ["batch", *[int(d) for d in self.model(source).output.shape[1:]]],
                "range": [0.0, 1.0],
                "to_uint8": "round(x * 255), halves to even (the SavedModel's generate)",
            },
            "test_vectors": vectors,
        }


KIND = SaganKind()
