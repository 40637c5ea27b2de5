"""Tables for summaries and comparisons (Markdown, readable in a terminal too)."""

import numpy as np


def mean_and_std(key, values):
    """{KEY_mean, KEY_std}: the mean and sample standard deviation (0.0 of one value) of
    `values`, to 4 places, as the --compare summaries report them over seeds."""
    std = round(float(np.std(values, ddof=1)), 4) if len(values) > 1 else 0.0
    return {f"{key}_mean": round(float(np.mean(values)), 4), f"{key}_std": std}


def format_value(value):
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1.0 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None else str(value)


def markdown_table(rows, columns):
    """rows: list of dicts; columns: list of (key, header)."""
    cells = [[header for _, header in columns]]
    cells += [[format_value(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
