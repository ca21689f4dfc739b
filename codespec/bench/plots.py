"""PNG plots of benchmark results (matplotlib, the `bench` extra; headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from codespec.errors import CodespecError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise CodespecError("plots need matplotlib: pip install -e '.[bench]' (or drop --out)") from None
    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def speedup_plot(results: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Grouped bars: tokens/s relative to plain, per workload and system."""
    plt = _pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    systems = [s for s in dict.fromkeys(r["system"] for r in results) if s != "plain"]
    ratio = {(r["workload"], r["system"]): r["ratio_vs_plain"] for r in results}
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads) + 2), 4.2))
    for i, system in enumerate(systems):
        xs = [w + (i - (len(systems) - 1) / 2) * width for w in range(len(workloads))]
        ys = [ratio.get((w, system), 0.0) for w in workloads]
        bars = ax.bar(xs, ys, width, label=system)
        ax.bar_label(bars, labels=[f"{y:.1f}" for y in ys], fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("tokens/s relative to plain greedy")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def index_latency_plot(results: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Draft latency (p50, p99) and bytes per token against the index's size."""
    plt = _pyplot()
    tokens = [r["tokens"] for r in results]
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    ax.plot(tokens, [r["draft_p50_us"] for r in results], marker="o", label="draft p50")
    ax.plot(tokens, [r["draft_p99_us"] for r in results], marker="s", label="draft p99")
    ax.set_xscale("log")
    ax.set_xlabel("indexed tokens")
    ax.set_ylabel("microseconds per draft (32 tokens)")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(tokens, [r["bytes_per_token"] for r in results], color="gray", linestyle="--", marker="^",
               label="bytes/token")
    right.set_ylabel("bytes per token")
    right.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(lines, [str(h.get_label()) for h in lines], fontsize=8, loc="center left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
