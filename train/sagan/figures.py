"""SAGAN figures: sample grids and the attention map of a few query pixels (paper Fig. 1 style)."""

import io

import matplotlib
import numpy as np

from zoo import atomic
from zoo.generate import grid, save_png  # one implementation for train and zoo

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def to_uint8(images):
    """Generator output in [-1, 1] -> uint8 [0, 255]."""
    return np.clip(np.round((np.asarray(images, np.float32) + 1.0) * 127.5), 0, 255).astype(
        np.uint8
    )


def save_sample_grid(images, columns, path):
    """Generator outputs [-1, 1] -> PNG grid (one row per class for conditional runs)."""
    save_png(grid(to_uint8(images), columns), path)


def _save(fig, path):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    atomic.write_bytes(path, buffer.getvalue())


def save_attention_figure(images, scores, feature_side, path, class_names, labels):
    """For each generator output [B, S, S, C] in [-1, 1], where four query pixels look
    (like the SAGAN paper's Fig. 1). `scores` [B, side*side, keys]: SelfAttention2D's
    weights, queries row-major on the feature_side map, keys on it or its 2x2 pooling;
    `labels`: None (unconditional) or the class ids naming each row."""
    images = to_uint8(images)
    scores = np.asarray(scores, np.float32)
    b, size = images.shape[0], images.shape[1]
    key_side = int(round(np.sqrt(scores.shape[-1])))
    q = size // 4  # the query pixels (row, col): the four quadrant centres
    points = [(q, q), (q, size - 1 - q), (size - 1 - q, q), (size - 1 - q, size - 1 - q)]
    colours = ["#ff3030", "#30c0ff", "#ffd700", "#40ff40"]
    cmap = "gray" if images.shape[-1] == 1 else None
    fig, axes = plt.subplots(
        b, len(points) + 1, figsize=(2.0 * (len(points) + 1), 2.0 * b), squeeze=False
    )
    for i in range(b):
        shown = images[i][..., 0] if images.shape[-1] == 1 else images[i]
        axes[i, 0].imshow(shown, cmap=cmap)
        title = "sample" if labels is None else class_names[int(labels[i])]
        axes[i, 0].set_title(title, fontsize=8)
        for j, ((r, c), colour) in enumerate(zip(points, colours)):
            fr, fc = r * feature_side // size, c * feature_side // size
            weights = scores[i, fr * feature_side + fc].reshape(key_side, key_side)
            heat = np.kron(weights, np.ones((size // key_side, size // key_side)))
            ax = axes[i, j + 1]
            ax.imshow(shown, cmap=cmap)
            ax.imshow(heat, cmap="inferno", alpha=0.6)
            ax.set_title(f"query ({r},{c})", fontsize=8)
            for ax in (axes[i, 0], ax):  # the query on the sample and on its map
                ax.plot(c, r, "o", color=colour, markersize=5, markeredgecolor="black")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("Generator self-attention: where each query pixel looks", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def save_progress_figure(history, path):
    """FID (log scale), class accuracy and consistency of the per-epoch evaluations."""
    epochs = [h["epoch"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    fids = [h.get("fid_quick") for h in history]
    if any(f is not None for f in fids):
        left.plot(epochs, [f if f is not None else np.nan for f in fids], "o-")
        left.set_yscale("log")
    left.set(xlabel="epoch", ylabel="FID (classifier features)", title="FID per epoch")
    for key, label in (
        ("class_accuracy_quick", "class accuracy"),
        ("consistent_quick", "consistent"),
    ):
        values = [h.get(key) for h in history]
        if any(v is not None for v in values):
            right.plot(epochs, [v if v is not None else np.nan for v in values], "o-", label=label)
    right.set(xlabel="epoch", ylim=(0, 1), title="generated images")
    right.legend(loc="lower right")
    fig.tight_layout()
    _save(fig, path)
