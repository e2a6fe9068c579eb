"""Matplotlib figures of simulation results (PNG, headless): one run's accuracy and ASR, a grid's lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(path: Path, results: dict[str, Any]) -> None:
    """Global test accuracy per round (round 0: the initial prompt), with the baseline if any."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    xs, ys = [], []
    if results.get("initial_accuracy") is not None:
        xs.append(0)
        ys.append(results["initial_accuracy"])
    for r in results["rounds"]:
        if r["accuracy"] is not None:
            xs.append(r["round"])
            ys.append(r["accuracy"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    spec = results["spec"]
    ax.plot(
        xs,
        [100 * y for y in ys],
        marker="o",
        label=f"federated (K={results.get('clients')}, C={spec['fraction']}, {results.get('partition', 'iid')})",
    )
    baseline = results.get("baseline")
    if baseline and baseline.get("accuracy") is not None:
        ax.axhline(
            100 * baseline["accuracy"], color="tab:red", linestyle="--", label="centralised, same samples"
        )
        ax.set_ylim(top=max(ax.get_ylim()[1], 100 * baseline["accuracy"] + 2))  # keep the line off the frame
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{results.get('dataset', '')} · {spec['model'].split('/')[-1]} · prompt tuning")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_asr(path: Path, results: dict[str, Any]) -> None:
    """Global ASR and malicious clients' local ASR per round, with the clean (initial prompt) ASR."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    rounds = results["rounds"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    xs = [r["round"] for r in rounds if r.get("asr") is not None]
    ys = [100 * r["asr"] for r in rounds if r.get("asr") is not None]
    if results.get("initial_asr") is not None:
        xs, ys = [0, *xs], [100 * results["initial_asr"], *ys]
        ax.axhline(
            100 * results["initial_asr"], color="grey", linestyle=":", label="clean ASR (initial prompt)"
        )
    ax.plot(xs, ys, marker="o", color="tab:blue", label="global prompt ASR")
    local = [(r["round"], 100 * r["local_asr"]) for r in rounds if r.get("local_asr") is not None]
    if local:
        ax.plot(*zip(*local, strict=True), marker="^", color="tab:red", label="malicious clients' local ASR")
    acc = [(r["round"], 100 * r["accuracy"]) for r in rounds if r.get("accuracy") is not None]
    if results.get("initial_accuracy") is not None:
        acc = [(0, 100 * results["initial_accuracy"]), *acc]
    if acc:
        ax.plot(*zip(*acc, strict=True), marker=".", color="tab:green", alpha=0.6, label="clean accuracy")
    door = results.get("backdoor") or {}
    spec = results["spec"]
    agg = (spec.get("aggregation") or {}).get("name", "fedavg")
    ax.set_title(
        f"{results.get('dataset', '')} · K={results.get('clients')}, {door.get('malicious', 0)} malicious · "
        f"{agg} · attack {door.get('attack', 'none')}",
        fontsize=10,
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-3, 103)
    ax.set_xlabel("round")
    ax.set_ylabel("%")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_lines(
    path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float, float]]]
) -> None:
    """One line per series of (x, mean, standard deviation) points, with a band of ± one deviation."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for label, points in series.items():
        if points:
            xs, means, stds = zip(*sorted(points), strict=True)
            (line,) = ax.plot(xs, means, marker="o", label=f"{label} (mean over seeds)")
            lo = [m - s for m, s in zip(means, stds, strict=True)]
            hi = [m + s for m, s in zip(means, stds, strict=True)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
