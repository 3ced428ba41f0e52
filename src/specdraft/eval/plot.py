"""The per-position acceptance plot (matplotlib, PNG, no display needed)."""

from __future__ import annotations

from pathlib import Path

from specdraft.core.atomic import atomic_open


def plot_acceptance(per_position: list[float], path: str | Path, *, title: str,
                    engine: list[float] | None = None, engine_label: str = "engine") -> Path:
    """Bar chart of acceptance rate by draft position (1-based), written atomically; with
    ``engine`` (the engine's rates), two bar series side by side: offline and engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    positions = list(range(1, len(per_position) + 1))
    series = [("offline", per_position, "#3b7dd8")]
    if engine:
        series.append((engine_label, engine, "#e07b39"))
    width = 0.8 / len(series)
    for i, (label, rates, color) in enumerate(series):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(1, len(rates) + 1)]
        ax.bar(xs, rates, width=width, color=color, label=label)
        for x, y in zip(xs, rates):
            ax.text(x, y + 0.02, f"{y:.2f}", ha="center", fontsize=7)
    if engine:
        ax.legend(fontsize=8)
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.1), title=title,
           xticks=positions)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return Path(path)
