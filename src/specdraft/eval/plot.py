"""The per-position acceptance plot (matplotlib, PNG, no display needed)."""

from __future__ import annotations

from pathlib import Path

from specdraft.core.atomic import atomic_open


def plot_acceptance(per_position: list[float], path: str | Path, *, title: str) -> Path:
    """Bar chart of acceptance rate by draft position (1-based), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    positions = list(range(1, len(per_position) + 1))
    ax.bar(positions, per_position, color="#3b7dd8")
    for x, y in zip(positions, per_position):
        ax.text(x, y + 0.02, f"{y:.2f}", ha="center", fontsize=8)
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.1), title=title,
           xticks=positions)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return Path(path)
