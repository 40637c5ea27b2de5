"""FID and KID between two sets of feature vectors (NumPy only).

The features come from the run's own frozen classifier (`train.sagan.fid_classifier`),
not Inception: Inception weights cannot be downloaded here (docs/facts.md). Numbers
are therefore comparable between runs on the same data and classifier, not with
published FIDs; the real-train vs real-test distance (`fid_floor`) says what "as
good as real data" looks like in this feature space.
"""

import numpy as np


def _stats(features):
    x = np.asarray(features, np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"features must be [N >= 2, D]. Received: shape={x.shape}")
    return x.mean(axis=0), np.cov(x, rowvar=False)


def frechet_distance(features_a, features_b):
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)) of Gaussian fits.

    The trace of the matrix square root is computed as the sum of square roots
    of the eigenvalues of S_a^(1/2) S_b S_a^(1/2) (symmetric PSD), which avoids
    scipy's `sqrtm` and its complex round-off.
    """
    mu_a, s_a = _stats(features_a)
    mu_b, s_b = _stats(features_b)
    w, v = np.linalg.eigh(s_a)
    root_a = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
    middle = root_a @ s_b @ root_a
    trace_sqrt = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0.0, None)).sum()
    value = float(np.sum((mu_a - mu_b) ** 2) + np.trace(s_a) + np.trace(s_b) - 2.0 * trace_sqrt)
    return max(value, 0.0)


def kernel_inception_distance(features_a, features_b):
    """Unbiased MMD^2, cubic polynomial kernel (Binkowski et al., 2018), over 10 subsets of 500."""
    a = np.asarray(features_a, np.float64)
    b = np.asarray(features_b, np.float64)
    m = min(500, len(a), len(b))
    if m < 2:
        raise ValueError(f"KID needs at least 2 samples per set. Received: {len(a)} and {len(b)}")
    d = a.shape[1]
    rng = np.random.default_rng(0)
    values = []
    for _ in range(10):
        x = a[rng.choice(len(a), m, replace=False)]
        y = b[rng.choice(len(b), m, replace=False)]
        kxx = (x @ x.T / d + 1) ** 3
        kyy = (y @ y.T / d + 1) ** 3
        kxy = (x @ y.T / d + 1) ** 3
        values.append(
            (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
            + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
            - 2 * kxy.mean()
        )
    return float(np.mean(values))
