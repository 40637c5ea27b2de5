"""Embedded SAGAN data: mirrored shapes with matching corner colours (generated, offline).

Each image (default 32x32 RGB) holds:
- a shape of the image's class (0 disc, 1 square, 2 right triangle, 3 "L") of a
  random size, position and colour in the left half, and its mirror image
  (reflected about the vertical centre line) in the right half, same colour;
- two corner patches (top-left and bottom-right) of one shared random colour;
- a random dark background with a little pixel noise.

What makes it a test of long-range structure: every pixel of the right half is
determined by a pixel up to a whole image width away, and the two corners
must agree across the diagonal. A convolutional generator has to carry that
information across its whole receptive field; attention can look it up. The
triangle and "L" are not left-right symmetric, so the mirror copy is not just
the same stamp twice.

Everything is NumPy and seeded: `make_shapes(n, size, seed)` returns the same
images on every machine.
"""

import numpy as np

CLASS_NAMES = ("disc", "square", "triangle", "ell")


def _shape_mask(kind, size, cy, cx, r):
    yy, xx = np.mgrid[0:size, 0:size]
    dy, dx = yy - cy, xx - cx
    if kind == 0:
        return dy * dy + dx * dx <= r * r
    if kind == 1:
        return (np.abs(dy) <= r * 0.8) & (np.abs(dx) <= r * 0.8)
    inside = (np.abs(dy) <= r) & (np.abs(dx) <= r)
    if kind == 2:  # right angle at bottom-left, hypotenuse rising to the right
        return inside & (dy >= dx)
    bar = max(1.0, r * 0.45)
    return inside & ((dx <= -r + bar) | (dy >= r - bar))


def _random_colour(rng):
    hue = rng.random()
    rgb = np.clip(np.abs(((hue * 6.0 + np.array([0.0, 4.0, 2.0])) % 6.0) - 3.0) - 1.0, 0.0, 1.0)
    return 0.35 + 0.65 * rgb


def make_shapes(n, size=32, seed=0):
    """`n` RGB images uint8 [n, size, size, 3] and labels int32 [n] (4 classes)."""
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), np.uint8)
    labels = rng.integers(0, len(CLASS_NAMES), size=n).astype(np.int32)
    scale = size / 32.0
    patch = max(2, int(round(4 * scale)))
    for i in range(n):
        image = np.empty((size, size, 3), np.float32)
        image[:] = rng.uniform(0.0, 0.25, size=3)
        image += rng.normal(0.0, 0.02, size=image.shape)
        r = rng.uniform(3.0, 6.0) * scale
        cx = rng.uniform(r + 1, size / 2 - 2)
        cy = rng.uniform(patch + r + 1, size - patch - r - 1)
        mask = _shape_mask(int(labels[i]), size, cy, cx, r)
        mask |= mask[:, ::-1]
        image[mask] = _random_colour(rng)
        corner = _random_colour(rng)
        image[:patch, :patch] = corner
        image[-patch:, -patch:] = corner
        image = np.clip(image, 0.0, 1.0)
        images[i] = np.round(image * 255).astype(np.uint8)
    return images, labels
