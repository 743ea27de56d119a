"""PNG plots of a ``loop.json`` document (matplotlib, Agg backend), one colour and marker per
variant in every plot (:data:`STYLE`):

* ``loop-curve.png``: bulk goodput and recovery after failed handovers against minrtt, per
  trip (points with 95 % CI bars);
* ``loop-learning.png``: top row per trip, bottom row pooled (cumulative over trips 1..k,
  solid with its 95 % band; the trailing window, dashed): the share of the trip's failures
  in cells of the table, the share the table had correct (Wilson intervals; no table: 0),
  and the recovery after failed handovers against minrtt;
* ``loop-gain.png``: the pooled recovery gain over no table of the learned and the oracle
  table, and gain_learned − gain_oracle/2 with its interval (≥ 0: half of the oracle's gain
  reached), with the trips from which that holds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from polycorn_bench.loop_curve import HOF_FIELD, LEARNED, NONE, TRUTH, VARIANTS

PLOT_FILE = "loop-curve.png"
LEARNING_FILE = "loop-learning.png"
GAIN_FILE = "loop-gain.png"
DPI = 120
#: Colour, marker and label of each variant, the same in every plot.
STYLE = {
    LEARNED: ("tab:blue", "o", "learned table"),
    NONE: ("tab:gray", "s", "no table"),
    TRUTH: ("tab:green", "^", "oracle table"),
}
#: The table (share fields' prefix) of each variant; no table has no shares (0).
SHARE_PREFIX = {LEARNED: "learned", TRUTH: "oracle"}
#: Plot range of the ratios (log scale); interval ends beyond it are cut at the edge.
Y_MIN, Y_MAX = 0.25, 4.0
#: Up to this many trips the x axis names each trip with its table; beyond, plain numbers.
LABELLED_TRIPS = 12


def _num(x: object) -> float:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else math.nan


def _bars(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> tuple[Any, Any, Any]:
    """Values of ``key`` and the distances to their ``key_ci95`` ends, NaN / 0 where
    missing."""
    vals, lo, hi = [], [], []
    for r in rows:
        v, ci = _num(r.get(key)), r.get(f"{key}_ci95")
        ok = math.isfinite(v) and isinstance(ci, list) and len(ci) == 2
        c0, c1 = (_num(ci[0]), _num(ci[1])) if ok and isinstance(ci, list) else (v, v)
        vals.append(v * scale)
        lo.append(max(0.0, (v - c0) * scale) if math.isfinite(c0) else 0.0)
        hi.append(max(0.0, (c1 - v) * scale) if math.isfinite(c1) else 0.0)
    return np.array(vals), np.array(lo), np.array(hi)


def _ratio_axis(ax: Any) -> None:
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    # Ratios: a log scale treats ×2 and ×0.5 alike; intervals of a handful of pairs can be
    # huge, so the axis is clipped and says so.
    ax.set_yscale("log")
    ax.set_ylim(Y_MIN, Y_MAX)
    ticks = [0.25, 0.5, 1.0, 2.0, 4.0]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()


def _share_axis(ax: Any) -> None:
    ax.set_ylim(-5, 105)
    ax.set_ylabel("% of the failures (Wilson 95 %)")


def _trip_axis(ax: Any, trips: list[dict[str, Any]], n_key: str | None) -> None:
    x = [t["trip"] for t in trips]
    ax.set_xlabel("trip")
    ax.grid(alpha=0.3)
    if len(trips) <= LABELLED_TRIPS and n_key is not None:
        ax.set_xticks(x)
        ax.set_xticklabels(
            [
                f"{t['trip']}\n"
                + (f"{t['table']['entries']} cells" if t["table"]["version"] else "no table")
                + f"\nn={t['variants'][LEARNED][n_key]}"
                for t in trips
            ],
            fontsize=8,
        )
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))


def _per_trip(ax: Any, rows: list[dict[str, Any]], keys: dict[str, str], scale: float) -> None:
    """Points with interval bars, one series per variant, slightly apart."""
    x = np.array([_num(r["trip"]) for r in rows])
    width = 0.12 if len(rows) <= LABELLED_TRIPS else 0.18
    for j, v in enumerate(VARIANTS):
        colour, marker, label = STYLE[v]
        key = keys.get(v)
        if key is None:  # no table: nothing known, nothing correct
            ax.plot(
                x + (j - 1) * width,
                np.zeros(len(x)),
                color=colour,
                marker=marker,
                linestyle="none",
                markersize=4,
                label=label,
            )
            continue
        vals, lo, hi = _bars(rows, key, scale)
        ax.errorbar(
            x + (j - 1) * width,
            vals,
            yerr=[lo, hi],
            color=colour,
            marker=marker,
            capsize=2,
            linestyle="none",
            markersize=4,
            elinewidth=0.8,
            label=label,
        )


def _pooled(ax: Any, curves: dict[str, Any], keys: dict[str, str], scale: float) -> None:
    """Cumulative curve with its band (solid), trailing window (dashed)."""
    cum, win = curves.get("cumulative") or [], curves.get("window") or []
    for v in VARIANTS:
        colour, marker, label = STYLE[v]
        key = keys.get(v)
        if key is None:
            xs = [r["trip"] for r in cum]
            ax.plot(
                xs,
                np.zeros(len(xs)),
                color=colour,
                marker=marker,
                markersize=3,
                linewidth=1.0,
                label=label,
            )
            continue
        for rows, dashed in ((cum, False), (win, True)):
            x = np.array([_num(r["trip"]) for r in rows])
            vals, lo, hi = _bars(rows, key, scale)
            ax.plot(
                x,
                vals,
                color=colour,
                marker=None if dashed else marker,
                markersize=3,
                linestyle="--" if dashed else "-",
                linewidth=0.9 if dashed else 1.3,
                label=None if dashed else label,
            )
            if not dashed:
                ax.fill_between(x, vals - lo, vals + hi, color=colour, alpha=0.15, linewidth=0)


def plot_curve(doc: dict[str, Any], directory: Path) -> Path:
    """The learning curve: goodput and recovery ratios per trip, one series per variant."""
    trips = doc["trips"]
    fig, axes = plt.subplots(1, 2, figsize=(11 if len(trips) <= LABELLED_TRIPS else 14, 4.2))
    for ax, key, title, n_key in (
        (axes[0], "goodput_vs_minrtt", "bulk goodput × minrtt", "n_pairs"),
        (axes[1], "hof_recovery_vs_minrtt", "recovery after failure × minrtt", "hof_n"),
    ):
        rows = [
            {
                "trip": t["trip"],
                **{f"{v}": t["variants"][v].get(key) for v in VARIANTS},
                **{
                    f"{v}_ci95": t["variants"][v].get(
                        "goodput_ci95" if key == "goodput_vs_minrtt" else "hof_recovery_ci95"
                    )
                    for v in VARIANTS
                },
            }
            for t in trips
        ]
        _per_trip(ax, rows, {v: v for v in VARIANTS}, 1.0)
        _ratio_axis(ax)
        ax.set_title(title)
        _trip_axis(ax, trips, n_key)
    axes[0].set_ylabel(f"ratio to minrtt (95 % CI, cut at {Y_MIN:g}–{Y_MAX:g})")
    axes[0].legend(fontsize=8)
    fig.suptitle("Closed fleet loop: hrsch with the table learned so far", fontsize=10)
    return _save(fig, directory / PLOT_FILE)


def _half_marks(ax: Any, doc: dict[str, Any]) -> str:
    """Vertical lines at the trips from which the cumulative recovery gain has half of the
    oracle's; returns the sentence for the title."""
    half = ((doc.get("half_oracle_gain_trip") or {}).get("hof_recovery") or {}).get(
        "cumulative"
    ) or {}
    point, lower = half.get("point"), half.get("lower_bound")
    if point is not None:
        ax.axvline(point, color="tab:blue", linestyle=":", linewidth=1.0)
    if lower is not None:
        ax.axvline(lower, color="tab:blue", linestyle="-.", linewidth=1.0)
    return (
        "half of the oracle's recovery gain (pooled 1..k):\n"
        f"point from trip {point if point is not None else '–'} (dotted), "
        f"lower bound from trip {lower if lower is not None else '–'} (dash-dot)"
    )


def plot_learning(doc: dict[str, Any], directory: Path) -> Path:
    """Table shares and recovery, per trip and pooled."""
    trips = doc["trips"]
    curves = doc.get("running") or {}
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), sharex=True)
    known = {v: f"{p}_known_failure_share" for v, p in SHARE_PREFIX.items()}
    correct = {v: f"{p}_correct_share" for v, p in SHARE_PREFIX.items()}
    hof = {v: HOF_FIELD[v] for v in VARIANTS}
    lead = (doc.get("parameters") or {}).get("lead_s")
    for col, keys, scale, title in (
        (0, known, 100.0, "failures in a cell of the table"),
        (1, correct, 100.0, f"failures the table had correct (lead {lead} s)"),
        (2, hof, 1.0, "recovery after failed handovers × minrtt"),
    ):
        top, bottom = axes[0][col], axes[1][col]
        _per_trip(top, trips, keys, scale)
        _pooled(bottom, curves, keys, scale)
        top.set_title(f"{title}: per trip", fontsize=10)
        bottom.set_title(f"{title}: pooled", fontsize=10)
        for ax in (top, bottom):
            if scale == 100.0:
                _share_axis(ax)
            else:
                _ratio_axis(ax)
                ax.set_ylabel("ratio of means (95 % bootstrap CI)")
            _trip_axis(ax, trips, None)
        top.tick_params(labelbottom=True)
    axes[0][0].legend(fontsize=8, loc="upper left")
    note = _half_marks(axes[1][2], doc)
    fig.suptitle(
        "Closed fleet loop: what the learned table knows, trip by trip (top) and pooled over "
        f"trips 1..k (bottom, solid, 95 % band; dashed: the last {curves.get('window_trips')} "
        f"trips); {note}",
        fontsize=10,
    )
    return _save(fig, directory / LEARNING_FILE)


def plot_gain(doc: dict[str, Any], directory: Path) -> Path:
    """Pooled recovery gain over no table, and the half-of-the-oracle test."""
    curves = doc.get("running") or {}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharex=True)
    cum = curves.get("cumulative") or []
    x = np.array([_num(r["trip"]) for r in cum])
    gains = [r["hof_recovery_gain"] for r in cum]
    g_l = np.array([_num(g.get("learned")) for g in gains])
    g_t = np.array([_num(g.get("oracle")) for g in gains])
    colour, marker, label = STYLE[LEARNED]
    t_colour, t_marker, t_label = STYLE[TRUTH]
    ax = axes[0]
    ax.plot(x, g_l, color=colour, marker=marker, markersize=3, label=label)
    ax.plot(x, g_t, color=t_colour, marker=t_marker, markersize=3, label=t_label)
    ax.plot(x, g_t / 2, color=t_colour, linestyle="--", linewidth=0.9, label="half the oracle's")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_ylabel("recovery ratio − no table's (pooled 1..k)")
    ax.set_title("recovery gain over no table, pooled over trips 1..k", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    for key, dashed in (("cumulative", False), ("window", True)):
        rows = curves.get(key) or []
        xs = np.array([_num(r["trip"]) for r in rows])
        ex = [
            {
                "trip": r["trip"],
                "e": r["hof_recovery_gain"].get("half_oracle_excess"),
                "e_ci95": r["hof_recovery_gain"].get("half_oracle_excess_ci95"),
            }
            for r in rows
        ]
        vals, lo, hi = _bars(ex, "e")
        ax.plot(
            xs,
            vals,
            color=colour,
            marker=None if dashed else marker,
            markersize=3,
            linestyle="--" if dashed else "-",
            label=f"last {curves.get('window_trips')} trips" if dashed else "trips 1..k",
        )
        ax.fill_between(
            xs, vals - lo, vals + hi, color=colour, alpha=0.08 if dashed else 0.18, linewidth=0
        )
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel("gain_learned − gain_oracle / 2 (95 % CI)")
    ax.set_title(_half_marks(ax, doc), fontsize=9)
    ax.legend(fontsize=8)
    for a in axes:
        a.set_xlabel("trip")
        a.grid(alpha=0.3)
        a.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))
    fig.suptitle(
        "Closed fleet loop: when does the learned table have half of the oracle's "
        "gain? (≥ 0 on the right)",
        fontsize=10,
    )
    return _save(fig, directory / GAIN_FILE)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_all(doc: dict[str, Any], directory: Path) -> list[Path]:
    """Every plot of the loop; the pooled ones only with the running curves."""
    written = [plot_curve(doc, directory)]
    if doc.get("running"):
        written += [plot_learning(doc, directory), plot_gain(doc, directory)]
    return written
