"""Image data for `python -m train sagan`: embedded shapes, tfds, or a directory of images.

Every reader returns `ImageData`: uint8 arrays [N, S, S, C] and int32 labels for a
train and a test split, class names and a description of the source. All checks
(missing or empty directory, mixed sizes, a size the generator cannot make) raise
`DataError`/`UsageError` before the run directory is created.
"""

import dataclasses
import os

import numpy as np

from zoo.cli import DataError, UsageError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
TFDS_NAMES = ("mnist", "fashion_mnist", "cifar10", "celeb_a")


@dataclasses.dataclass
class ImageData:
    train: np.ndarray
    train_labels: np.ndarray
    test: np.ndarray
    test_labels: np.ndarray
    class_names: list
    source: dict

    @property
    def image_size(self):
        return int(self.train.shape[1])

    @property
    def channels(self):
        return int(self.train.shape[-1])

    @property
    def num_classes(self):
        return len(self.class_names)


def check_size(size, flag="--image-size"):
    if size < 32 or size & (size - 1):
        raise UsageError(
            f"{flag} must be a power of two >= 32 (the generator doubles 4x4 up to it), got {size}"
        )


def load_images(cfg):
    """The data the options `cfg` (train.sagan.SaganConfig, whose `check` checked
    --image-size) name (default: the embedded shapes), split by the data seed (--data-seed,
    else --seed)."""
    image_size, seed = cfg.image_size, cfg.resolved_data_seed()
    if cfg.dataset and cfg.image_dir:
        raise UsageError("--dataset and --image-dir cannot be combined")
    if cfg.image_dir:
        return load_image_dir(cfg.image_dir, image_size, cfg.max_images, seed)
    if cfg.dataset:
        return load_tfds_images(cfg.dataset, image_size, cfg.max_images)
    from train.sagan.shapes import CLASS_NAMES, make_shapes

    size = image_size or 32
    train, train_labels = make_shapes(cfg.train_size, size, seed=seed)
    test, test_labels = make_shapes(cfg.test_size, size, seed=seed + 10_000)
    source = {
        "name": "embedded",
        "generator": "train.sagan.shapes",
        "seed": seed,
        "train": cfg.train_size,
        "test": cfg.test_size,
        "image_size": size,
    }
    return ImageData(train, train_labels, test, test_labels, list(CLASS_NAMES), source)


def _list_image_dir(path):
    if not os.path.isdir(path):
        raise DataError(f"--image-dir is not a directory: {path}")
    classes = sorted(
        d
        for d in os.listdir(path)
        if os.path.isdir(os.path.join(path, d)) and not d.startswith(".")
    )
    files = {}
    for name in classes:
        folder = os.path.join(path, name)
        found = sorted(
            os.path.join(folder, f)
            for f in os.listdir(folder)
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        if found:
            files[name] = found
    if not files:
        raise DataError(
            f"--image-dir has no images (expected class sub-folders holding "
            f"{'/'.join(IMAGE_EXTENSIONS)} files): {path}"
        )
    return files


def _common_size(files, image_size):
    """The images' shared square power-of-two side; DataError on mixed or bad sizes."""
    from PIL import Image

    first = None
    for paths in files.values():
        for p in paths:
            try:
                with Image.open(p) as im:
                    size = im.size
                    im.verify()  # chunk checksums: a damaged body fails here, not in TF's decoder
            except Exception as e:  # noqa: BLE001  (PIL raises several types)
                raise DataError(f"cannot read image {p}: {str(e).splitlines()[0]}") from None
            if first is None:
                first = (p, size)
            elif size != first[1] and image_size is None:
                raise DataError(
                    f"--image-dir images have mixed sizes ({first[0]} is {first[1][0]}x{first[1][1]}, "
                    f"{p} is {size[0]}x{size[1]}); pass --image-size N to resize them all"
                )
    if image_size is not None:
        return image_size
    w, h = first[1]
    if w != h:
        raise DataError(
            f"--image-dir images are not square ({w}x{h}); pass --image-size N to resize them"
        )
    check_size(w, flag=f"image size of --image-dir ({first[0]})")
    return w


def load_image_dir(path, image_size=None, max_images=None, seed=0):
    """Class-per-sub-folder images via keras.utils.image_dataset_from_directory."""
    files = _list_image_dir(path)
    size = _common_size(files, image_size)
    import keras

    dataset = keras.utils.image_dataset_from_directory(
        path,
        labels="inferred",
        label_mode="int",
        class_names=sorted(files),
        image_size=(size, size),
        batch_size=None,
        shuffle=False,
        crop_to_aspect_ratio=True,
        verbose=False,
    )
    images, labels = [], []
    import tensorflow as tf

    try:
        for image, label in dataset.as_numpy_iterator():
            images.append(np.clip(np.round(image), 0, 255).astype(np.uint8))
            labels.append(int(label))
    except tf.errors.InvalidArgumentError as e:
        detail = " ".join(str(e.message).split()).split("transformation with iterator:")[-1][-120:]
        raise DataError(
            f"--image-dir holds an image that cannot be decoded ({detail.strip()}): {path}"
        ) from None
    images, labels = np.stack(images), np.asarray(labels, np.int32)
    if len(images) < 4:
        raise DataError(f"--image-dir has only {len(images)} images; need at least 4: {path}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(images))[:max_images]  # None: all
    n_test = max(1, len(order) // 10)
    test, train = order[:n_test], order[n_test:]
    source = {
        "name": "image_dir",
        "path": os.path.abspath(path),
        "images": len(order),
        "image_size": size,
        "test": "10% held out",
    }
    return ImageData(
        images[train], labels[train], images[test], labels[test], sorted(files), source
    )


def load_tfds_images(value, image_size=None, max_images=None):
    """mnist / fashion_mnist / cifar10 / celeb_a through tensorflow-datasets (downloads)."""
    name = value[len("tfds:") :].strip() if value.startswith("tfds:") else None
    if name not in TFDS_NAMES:
        raise UsageError(
            f"--dataset must be tfds:NAME with NAME in {', '.join(TFDS_NAMES)}: {value!r}"
        )
    import tensorflow as tf

    from train import tfds

    size = image_size or (64 if name == "celeb_a" else 32)
    builder = tfds.open_builder(name)
    tfds.prepare(builder, name)
    class_names = ["face"] if name == "celeb_a" else list(builder.info.features["label"].names)

    def prepare(example):
        image = tf.cast(example["image"], tf.float32)
        if name == "celeb_a":  # 218x178: centre square crop, as in most GAN papers
            image = tf.image.crop_to_bounding_box(image, 40, 9, 160, 160)
        image = tf.image.resize(image, (size, size), antialias=True)
        label = tf.zeros((), tf.int32) if name == "celeb_a" else tf.cast(example["label"], tf.int32)
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8), label

    def split(which, limit):
        ds = builder.as_dataset(split=which).map(prepare)
        if limit:
            ds = ds.take(limit)
        images, labels = zip(*ds.batch(1024).as_numpy_iterator())
        return np.concatenate(images), np.concatenate(labels).astype(np.int32)

    train, train_labels = split("train", max_images)
    test, test_labels = split("test", max_images and max(1, max_images // 5))
    source = {"name": f"tfds:{name}", "image_size": size, "train": len(train), "test": len(test)}
    return ImageData(train, train_labels, test, test_labels, class_names, source)
