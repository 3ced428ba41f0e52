"""The per-position acceptance plot (matplotlib, PNG, no display needed)."""

from __future__ import annotations

from pathlib import Path

from specdraft.core.atomic import atomic_open


def context_bars(by_context: dict[str, dict] | None) -> list[tuple[str, float, int]]:
    """(bucket label, τ, verify steps) per non-empty context bucket, in bucket order
    (:meth:`specdraft.eval.acceptance.AcceptanceStats.by_context`)."""
    return [(label, row["tau"], row["verify_steps"]) for label, row in (by_context or {}).items()]


def plot_acceptance(per_position: list[float], path: str | Path, *, title: str,
                    engine: list[float] | None = None, engine_label: str = "engine",
                    by_context: dict[str, dict] | None = None) -> Path:
    """Bar chart of acceptance rate by draft position (1-based), written atomically; with
    ``engine`` (the engine's rates), two bar series side by side: offline and engine; with
    ``by_context``, a second panel of τ per context-length bucket (steps counted on top)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = context_bars(by_context)
    if bars:
        fig, (ax, cx) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=100,
                                     gridspec_kw={"width_ratios": [2, 1]})
        cx.bar(range(len(bars)), [t for _, t, _ in bars], color="#5a9e6f")
        for x, (_, tau, n) in enumerate(bars):
            cx.text(x, tau + 0.02, f"{tau:.2f}\n{n} steps", ha="center", fontsize=7)
        cx.set(xlabel="context length (tokens)", ylabel="tau", title="tau by context",
               xticks=range(len(bars)), xticklabels=[b[0] for b in bars],
               ylim=(0, max(t for _, t, _ in bars) * 1.3 + 0.1))
    else:
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
