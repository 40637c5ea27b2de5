"""attention.png: the attention weights of every head, for one sample sentence."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from zoo import atomic  # noqa: E402


def plot_attention(model, tokens, path):
    """Grid of heatmaps (rows: blocks, columns: heads); nothing for an arch without
    attention."""
    scores = model.attention_scores(tokens)
    if not scores:
        return
    predicted = [tag for _, tag in model.tag([list(tokens)])[0]]
    labels = [f"{tok}/{tag}" for tok, tag in zip(tokens, predicted)]
    rows, cols = len(scores), scores[0].shape[0]
    size = max(2.2, 0.35 * len(tokens) + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    n = len(tokens)
    for r, block in enumerate(scores):
        for h in range(cols):
            ax = axes[r][h]
            ax.imshow(block[h, :n, :n], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"block {r + 1}, head {h + 1}", fontsize=9)
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=8)
            ax.set_yticks(range(n), labels if h == 0 else [""] * n, fontsize=8)
    fig.suptitle("Self-attention weights (row: query word/predicted tag, column: key)")
    fig.tight_layout()
    with atomic.building(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
