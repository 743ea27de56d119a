"""PNG plots of an ``hsr.json`` document (matplotlib, Agg backend, no display needed).

Files, per link set ``LS`` (only those with data are written):

* ``LS-ratio-minrtt.png``: goodput ratio vs minrtt per size, grouped bars, 95 % CI bars;
* ``LS-goodput-cdf.png``: goodput CDF per size, one line per scheme;
* ``LS-ratio-oracle.png``: oracle time / actual time per size;
* ``LS-im.png``: IM mean and p90 delay against the number of users;
* ``LS-handovers.png``: ratio vs minrtt by handovers during the flow;
* ``LS-ablation.png``: goodput gain over minrtt of each HRSCH mechanism alone and of hrsch,
  with the paper's gains.

Every scheme keeps one colour, marker and hatch across plots and runs (``styles``), and the
run's default pipeline is drawn with a black edge or a thicker line and labelled "(default)".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from polycorn_bench.analysis import HANDOVER_BINS, OVERALL
from polycorn_bench.styles import label as scheme_label
from polycorn_bench.styles import style

DPI = 120


def _labels(doc: dict[str, Any], per_scheme: dict[str, dict[str, Any]]) -> list[str]:
    present = {k for per in per_scheme.values() for k in per}
    known = [k for k in doc.get("sizes", {}) if k in present]
    extra = sorted(present - set(known) - {OVERALL})
    return known + extra + ([OVERALL] if OVERALL in present else [])


def _grouped_bars(
    ax: Any,
    groups: list[str],
    per_scheme: dict[str, dict[str, Any]],
    key: str,
    ci_key: str | None,
    *,
    default: str | None,
) -> None:
    schemes = list(per_scheme)
    width = 0.8 / max(1, len(schemes))
    x = np.arange(len(groups))
    for i, scheme in enumerate(schemes):
        vals, lo, hi = [], [], []
        for g in groups:
            s = per_scheme[scheme].get(g) or {}
            v = s.get(key)
            vals.append(np.nan if v is None else v)
            ci = s.get(ci_key) if ci_key else None
            if v is not None and ci and ci[0] is not None and ci[1] is not None:
                lo.append(v - ci[0])
                hi.append(ci[1] - v)
            else:
                lo.append(0.0)
                hi.append(0.0)
        st = style(scheme, default)
        ax.bar(
            x + (i - (len(schemes) - 1) / 2) * width,
            vals,
            width,
            label=scheme_label(scheme, default),
            yerr=[lo, hi] if ci_key else None,
            capsize=2,
            color=st.color,
            hatch=st.hatch,
            edgecolor=st.edgecolor,
            linewidth=1.2 if st.default else 0.0,
            zorder=st.zorder,
        )
    ax.set_xticks(x, groups)
    ax.grid(axis="y", alpha=0.3)


def _legend_outside(ax: Any) -> None:
    n = len(ax.get_legend_handles_labels()[1])
    ax.legend(
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="scheme",
        ncol=max(1, -(-n // 14)),
    )


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_link_set(doc: dict[str, Any], name: str, ls: dict[str, Any], out: Path) -> list[Path]:
    written: list[Path] = []
    written += _plot_bulk(doc, name, ls, out)
    written += _plot_goodput_cdf(doc, name, ls, out)
    written += _plot_im(doc, name, ls, out)
    written += _plot_handovers(doc, name, ls, out)
    written += _plot_ablation(doc, name, ls, out)
    return written


def _plot_bulk(doc: dict[str, Any], name: str, ls: dict[str, Any], out: Path) -> list[Path]:
    """The goodput ratios vs minrtt and vs the oracle, by download size."""
    default = doc.get("default_scheme")
    bulk = ls.get("bulk", {})
    if not bulk:
        return []
    written: list[Path] = []
    groups = _labels(doc, bulk)
    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    _grouped_bars(ax, groups, bulk, "ratio_vs_minrtt", "ci95", default=default)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("download size")
    ax.set_ylabel("goodput / minrtt goodput\n(geometric mean of pairs, 95 % CI)")
    ax.set_title(f"{name}: bulk goodput relative to minrtt")
    _legend_outside(ax)
    written.append(_save(fig, out / f"{name}-ratio-minrtt.png"))

    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    _grouped_bars(ax, groups, bulk, "ratio_vs_oracle", None, default=default)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("download size")
    ax.set_ylabel("oracle time / actual time\n(geometric mean, 1 = oracle)")
    ax.set_title(f"{name}: bulk completion time relative to the oracle")
    _legend_outside(ax)
    written.append(_save(fig, out / f"{name}-ratio-oracle.png"))
    return written


def _plot_goodput_cdf(doc: dict[str, Any], name: str, ls: dict[str, Any], out: Path) -> list[Path]:
    """The goodput CDF of each download size."""
    default = doc.get("default_scheme")
    goodputs = ls.get("goodput_mbps", {})
    sizes = [
        k
        for k in _labels(doc, goodputs)
        if k != OVERALL and any(per.get(k) for per in goodputs.values())
    ]
    if not sizes:
        return []
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes) + 1.5, 3.8), squeeze=False)
    for ax, label in zip(axes[0], sizes, strict=True):
        for scheme, per in goodputs.items():
            v = np.sort(np.asarray(per.get(label, []), dtype=float))
            if len(v):
                st = style(scheme, default)
                ax.step(
                    v,
                    np.arange(1, len(v) + 1) / len(v),
                    where="post",
                    label=scheme_label(scheme, default),
                    color=st.color,
                    linewidth=st.linewidth,
                    zorder=st.zorder,
                )
        ax.set_title(label)
        ax.set_xlabel("goodput (Mbit/s)")
        ax.set_ylabel("fraction of downloads")
        ax.grid(alpha=0.3)
    _legend_outside(axes[0][-1])
    fig.suptitle(f"{name}: goodput CDF (timeouts censored at their timeout)")
    return [_save(fig, out / f"{name}-goodput-cdf.png")]


def _plot_im(doc: dict[str, Any], name: str, ls: dict[str, Any], out: Path) -> list[Path]:
    """Interactive message delay by number of users."""
    default = doc.get("default_scheme")
    im = ls.get("im", {})
    if not im:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4))
    for ax, key, title in zip(
        axes, ("mean_ms", "p90_ms"), ("mean delay", "90th percentile delay"), strict=True
    ):
        for scheme, per in im.items():
            us = sorted(per, key=int)
            ys = [np.nan if per[u][key] is None else per[u][key] for u in us]
            st = style(scheme, default)
            ax.plot(
                [int(u) for u in us],
                ys,
                marker=st.marker,
                label=scheme_label(scheme, default),
                color=st.color,
                linewidth=st.linewidth,
                zorder=st.zorder,
            )
        ax.set_xticks(sorted({int(u) for per in im.values() for u in per}))
        ax.set_xlabel("concurrent IM users")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    _legend_outside(axes[1])
    fig.suptitle(f"{name}: interactive message delay")
    return [_save(fig, out / f"{name}-im.png")]


def _plot_handovers(doc: dict[str, Any], name: str, ls: dict[str, Any], out: Path) -> list[Path]:
    """The goodput ratio vs minrtt by handovers during the download."""
    default = doc.get("default_scheme")
    by_ho = ls.get("bulk_by_handovers")
    if not by_ho:
        return []
    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    _grouped_bars(ax, list(HANDOVER_BINS), by_ho, "ratio_vs_minrtt", "ci95", default=default)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("handovers during the minrtt download (all sizes)")
    ax.set_ylabel("goodput / minrtt goodput\n(geometric mean of pairs, 95 % CI)")
    ax.set_title(f"{name}: goodput relative to minrtt by handovers")
    _legend_outside(ax)
    return [_save(fig, out / f"{name}-handovers.png")]


def _plot_ablation(doc: dict[str, Any], name: str, ls: dict[str, Any], out: Path) -> list[Path]:
    """The HRSCH ablation's goodput gains, with the paper's."""
    abl = ls.get("ablation")
    if not abl:
        return []
    schemes = list(abl)
    x = np.arange(len(schemes))
    gains = [np.nan if abl[s]["gain"] is None else abl[s]["gain"] * 100 for s in schemes]
    lo, hi = [], []
    for s, g in zip(schemes, gains, strict=True):
        ci = abl[s]["ci95"]
        ok = ci and ci[0] is not None and ci[1] is not None and np.isfinite(g)
        lo.append(g - ci[0] * 100 if ok else 0.0)
        hi.append(ci[1] * 100 - g if ok else 0.0)
    paper = [
        np.nan if abl[s]["paper_gain"] is None else abl[s]["paper_gain"] * 100 for s in schemes
    ]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.bar(x, gains, 0.6, yerr=[lo, hi], capsize=3, label="this run (95 % CI)")
    ax.scatter(x, paper, marker="D", color="black", zorder=3, label="paper")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(x, [f"{abl[s]['mechanism']}\n{s}" for s in schemes])
    ax.set_ylabel("goodput gain over minrtt (%)\n(geometric mean of pairs)")
    ax.set_title(f"{name}: HRSCH ablation")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    return [_save(fig, out / f"{name}-ablation.png")]


def plot_all(doc: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, ls in doc.get("link_sets", {}).items():
        written += plot_link_set(doc, name, ls, out)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m polycorn_bench.plots HSR_JSON OUT_DIR [--only NAME ...]``: the plots of a
    results document (e.g. ``bench/out/hsr.json``) redrawn from the document alone, so the
    figures the docs show come from ``bench/out``."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("doc", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="*", default=None, help="keep only these file names")
    a = p.parse_args(argv)
    written = plot_all(json.loads(a.doc.read_text(encoding="utf-8")), a.out)
    for path in written:
        if a.only is not None and path.name not in a.only:
            path.unlink()
        else:
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
