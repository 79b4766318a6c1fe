"""Predicted vs measured time of every tuning trial (matplotlib, imported only here)."""
from __future__ import annotations


def plot_predicted_vs_measured(trials, path: str, title: str = "") -> str:
    """Scatter of the model's per-config estimate against the measured median, log-log, one
    colour per algorithm, with the y = x line.  ``trials``: ``tuner.Trial`` objects or
    ``(algorithm, predicted_s, measured_s)`` tuples.  Returns the path written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # optional dependency
        raise RuntimeError("plotting needs matplotlib: pip install 'lcmac[plot]'") from e
    pts = []
    for t in trials:
        if isinstance(t, tuple):
            pts.append(t)
        elif t.ok and t.point.predicted_s == t.point.predicted_s:
            pts.append((t.point.algorithm, t.point.predicted_s, t.time_s))
    fig, ax = plt.subplots(figsize=(5.5, 5))
    algs = sorted({a for a, _, _ in pts})
    for a in algs:
        xs = [p * 1e3 for b, p, _ in pts if b == a]
        ys = [m * 1e3 for b, _, m in pts if b == a]
        ax.scatter(xs, ys, s=18, label=a, alpha=0.8)
    if pts:
        lo = min(min(p, m) for _, p, m in pts) * 1e3 * 0.8
        hi = max(max(p, m) for _, p, m in pts) * 1e3 * 1.25
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted time (ms, analytic model)")
    ax.set_ylabel("measured time (ms, median)")
    ax.set_title(title or "lcmac tune: predicted vs measured")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
