"""The learning curve of the closed fleet loop (``make bench-loop``).

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.loop RUN_DIR \\
        [--out bench/out/loop.json] [--md bench/out/loop.md] [--plots docs/img/loop] [--quiet]

``RUN_DIR`` is what ``scripts/bench-loop.sh`` leaves: the layout of a bench-hsr run (see
``records``) with one link set, ``hsr``, whose trips ran one after the other, and four
"schemes" per trip, all copies of the topology side by side on the same trip:

* ``hrsch-learned``: hrsch with the table the trainer learned from the trips before;
* ``minrtt``: the reference;
* ``hrsch-none``: hrsch without a table;
* ``hrsch-truth``: hrsch with the oracle table (every cell where this trip fails).

Per trip the loop also leaves ``RUN/hsr/<trip>/loop-trip.json`` (trip number, the learned
table's version and entries, handover counts of the event log and of LinkDB, the trainer's
summary after the trip) and the tables themselves, ``failure-table-learned.json`` (absent
before the first table) and ``failure-table-truth.json``.

Numbers per trip and variant, with :mod:`polycorn_bench.analysis` and
:mod:`polycorn_bench.hrsch` on that trip alone: bulk goodput against minrtt (geometric mean of
the paired ratios, all sizes, 95 % bootstrap CI), the recovery after failed handovers against
minrtt (goodput in the 2 s from each failed handover's start, ratio of means, 95 % bootstrap
CI), and the backlogged download's goodput against minrtt. The same numbers pooled over the
trips that ran with a learned table (trip 2 on) are in ``pooled_learned_trips``. Table
coverage: how many of the trip's failed handovers leave a cell that has an entry in the table
used, and how far the entry's position is from the failure's start.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench import hrsch
from polycorn_bench.analysis import (
    _json_safe,
    backlog_summary,
    bulk_summary,
    size_labels,
)
from polycorn_bench.flows import OVERALL, REFERENCE, collect_backlogs, collect_flows
from polycorn_bench.records import HandoverFailure, LinkSetRun, Run, TripRun, read_run

LEARNED = "hrsch-learned"
NONE = "hrsch-none"
TRUTH = "hrsch-truth"
VARIANTS = (LEARNED, NONE, TRUTH)
VARIANT_TEXT = {
    LEARNED: "hrsch with the table learned from the previous trips (trip 1: none)",
    NONE: "hrsch without a table",
    TRUTH: "hrsch with the oracle table: every cell where this trip fails",
    REFERENCE: "the reference of every ratio",
}
LINK_SET = "hsr"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "out" / "loop.json"
PLOT_FILE = "loop-curve.png"
#: Plot range of the ratios (log scale); interval ends beyond it are cut at the edge.
Y_MIN, Y_MAX = 0.25, 4.0

METHODS = {
    "goodput": (
        "bulk downloads of the trip, all sizes: geometric mean over paired downloads (same "
        "trip and id) of goodput_variant/goodput_minrtt, 95 % percentile bootstrap CI of the "
        "pairs (10000 resamples, fixed seed); timeouts censored at the timeout as in hsr.json"
    ),
    "hof_recovery": (
        "goodput in the 2 s from the start of each failed handover of the trip, of the bulk or "
        "backlogged download in flight in both the variant and minrtt; ratio of means with a "
        "95 % bootstrap CI of the pairs (hrsch.hof_recovery)"
    ),
    "backlog": "backlogged download's goodput over its window / minrtt's (one pair per trip)",
    "table_coverage": (
        "failed handovers of the trip (handover_end outcome not success) whose source cell, "
        "as the data plane's ID ((carrier + 1) << 32 | cell), has an entry in the table the "
        "variant used; position error = |entry position_m - failure start track_m|"
    ),
    "pooled_learned_trips": (
        "the same numbers over all trips that ran with a learned table pooled (pairs from "
        "every such trip in one bootstrap)"
    ),
}


def cell_id(carrier: int, cell: int) -> int:
    """The data plane's (and LinkDB's) ID of a testbed cell."""
    return (carrier + 1) << 32 | cell


@dataclass(frozen=True)
class Table:
    """The entries of a failure-location table: cell ID -> (position_m, failures)."""

    version: int | None
    entries: dict[int, tuple[float, int | None]]


def read_table(path: Path) -> Table | None:
    """A ``polycorn-failure-table/1`` file, or None when absent or unusable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        return None
    entries: dict[int, tuple[float, int | None]] = {}
    for e in doc["entries"]:
        if not isinstance(e, dict):
            continue
        cell, pos, fails = e.get("cell"), e.get("position_m"), e.get("failures")
        if isinstance(cell, int) and isinstance(pos, int | float) and math.isfinite(pos):
            entries[cell] = (float(pos), fails if isinstance(fails, int) else None)
    version = doc.get("version")
    return Table(version if isinstance(version, int) else None, entries)


def coverage(failures: list[HandoverFailure], table: Table | None) -> dict[str, Any]:
    """How many failures the table knows the cell of, and how far off its position is."""
    covered: list[float | None] = []
    for f in failures:
        if table is None or f.carrier is None or f.from_cell is None:
            continue
        hit = table.entries.get(cell_id(f.carrier, f.from_cell))
        if hit is not None:
            covered.append(None if f.track_m is None else abs(hit[0] - f.track_m))
    errs = [e for e in covered if e is not None]
    return {
        "entries": len(table.entries) if table else 0,
        "failures": len(failures),
        "failures_in_table_cells": len(covered),
        "position_error_m_median": float(np.median(errs)) if errs else None,
    }


def _variant_numbers(ls: LinkSetRun, run: Run) -> dict[str, dict[str, Any]]:
    """Goodput, recovery and backlog of each variant against minrtt over ``ls``'s trips."""
    flows = collect_flows(ls, run, with_oracle=False)
    backlogs = collect_backlogs(ls, run.issues)
    schemes = [s for s in run.schemes if s in (REFERENCE, *VARIANTS)]
    bulk = bulk_summary(flows, schemes, size_labels(run))
    hof, _ = hrsch.hof_recovery(flows, ls, schemes, backlogs)
    back = backlog_summary(backlogs, schemes) or {}
    by_scheme = (hof or {}).get("by_scheme", {})
    out: dict[str, dict[str, Any]] = {}
    for v in VARIANTS:
        g = bulk.get(v, {}).get(OVERALL, {})
        h = by_scheme.get(v, {})
        b = back.get(v, {})
        out[v] = {
            "goodput_vs_minrtt": g.get("ratio_vs_minrtt"),
            "goodput_ci95": g.get("ci95"),
            "n_pairs": g.get("n_pairs", 0),
            "n_timeout": g.get("n_timeout"),
            "hof_recovery_vs_minrtt": h.get("ratio_of_means"),
            "hof_recovery_ci95": h.get("ci95"),
            "hof_recovery_median_ratio": h.get("ratio_of_medians"),
            "hof_n": h.get("n", 0),
            "backlog_vs_minrtt": b.get("ratio_vs_minrtt"),
        }
    out["_failures"] = {"n": (hof or {}).get("n_failures", 0)}
    return out


HOF_REJECTIONS = (
    'polycorn_sched_schedulerlet_events_total{schedulerlet="hof-reject",event="rejections"}'
)


def hof_rejections(path: Path) -> int | None:
    """How often ``hof-reject`` took a path out of use, from an end-of-trip metrics snapshot;
    None without the file or the series."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        if name == HOF_REJECTIONS:
            try:
                return int(float(value))
            except ValueError:
                return None
    return None


def _rejections(trip: TripRun) -> dict[str, dict[str, int | None]]:
    out = {}
    for v in VARIANTS:
        logs = trip.trip_dir.parent / v / "logs"
        out[v] = {
            "proxy": hof_rejections(logs / "proxy.metrics"),
            "relay": hof_rejections(logs / "relay.metrics"),
        }
    return out


def _trip_meta(trip: TripRun) -> dict[str, Any]:
    path = trip.trip_dir.parent / "loop-trip.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _trainer_brief(summary: object) -> dict[str, Any] | None:
    if not isinstance(summary, dict):
        return None
    table = summary.get("table")
    val = summary.get("validation")
    keep = ("failure_correct", "failure_late", "failure_early", "failures", "successes")
    return {
        "model_id": summary.get("model_id"),
        "cells": summary.get("cells"),
        "cells_fitted": summary.get("cells_fitted"),
        "handovers": summary.get("handovers"),
        "table": {k: table.get(k) for k in ("version", "entries")}
        if isinstance(table, dict)
        else None,
        "validation": {k: val.get(k) for k in keep} if isinstance(val, dict) else None,
    }


def analyse_loop(run: Run) -> dict[str, Any]:
    """The ``loop.json`` document."""
    ls = next((x for x in run.link_sets if x.name == LINK_SET), None)
    if ls is None and run.link_sets:
        ls = run.link_sets[0]
    trips_out: list[dict[str, Any]] = []
    learned_trips: list[TripRun] = []
    for index, trip in enumerate(ls.trips if ls else [], start=1):
        assert ls is not None
        meta = _trip_meta(trip)
        one = replace(ls, trips=[trip])
        nums = _variant_numbers(one, run)
        failures = trip.handover_failures or []
        learned = read_table(trip.trip_dir.parent / "failure-table-learned.json")
        truth = read_table(trip.trip_dir.parent / "failure-table-truth.json")
        lt = meta.get("learned_table")
        if learned is not None:
            learned_trips.append(trip)
        main = nums[LEARNED]
        trips_out.append(
            {
                "trip": meta.get("trip", index),
                "id": trip.name,
                "trip_seed": meta.get("trip_seed"),
                "hrsch_vs_minrtt": main["goodput_vs_minrtt"],
                "hrsch_vs_minrtt_ci95": main["goodput_ci95"],
                "n": main["n_pairs"],
                "hof_recovery_vs_minrtt": main["hof_recovery_vs_minrtt"],
                "hof_recovery_ci95": main["hof_recovery_ci95"],
                "hof_n": main["hof_n"],
                "table": {
                    "version": lt.get("version") if isinstance(lt, dict) else None,
                    **coverage(failures, learned),
                },
                "truth_table": coverage(failures, truth),
                "variants": {v: nums[v] for v in VARIANTS},
                "hof_reject_rejections": _rejections(trip),
                "handovers": meta.get("handovers"),
                "table_in_use_at_end": meta.get("in_use_at_end"),
                "trainer_after": _trainer_brief(meta.get("trainer_after")),
                "load_start_s": meta.get("load_start_s"),
                "backlog_end_s": meta.get("backlog_end_s"),
            }
        )
    pooled = None
    if ls is not None and learned_trips:
        nums = _variant_numbers(replace(ls, trips=learned_trips), run)
        pooled = {
            "trips": [t.name for t in learned_trips],
            "failures": nums["_failures"]["n"],
            "variants": {v: nums[v] for v in VARIANTS},
        }
    doc: dict[str, Any] = {
        "profile": run.meta.get("profile"),
        "diagnostic": run.meta.get("diagnostic"),
        "commit": run.meta.get("commit"),
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_dir": str(run.root),
        "description": ls.description if ls else None,
        "loop": run.meta.get("loop"),
        "variants": VARIANT_TEXT,
        "trips": trips_out,
        "pooled_learned_trips": pooled,
        "methods": METHODS,
        "issues": run.issues.to_json(),
    }
    result = _json_safe(doc)
    assert isinstance(result, dict)
    return result


def _fmt(x: object, ci: object = None) -> str:
    if not isinstance(x, int | float):
        return "–"
    s = f"{x:.2f}"
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(c, int | float) for c in ci):
        s += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return s


def _in_use(t: dict[str, Any]) -> str:
    u = t.get("table_in_use_at_end") or {}
    v, n = u.get("proxy_version"), u.get("proxy_entries")
    if not isinstance(v, int | float) or v <= 0:
        return "none"
    return f"v{v:.0f}, {n:.0f}" if isinstance(n, int | float) else f"v{v:.0f}"


def markdown(doc: dict[str, Any]) -> str:
    """The report: one row per trip, then the pooled numbers."""
    out = [
        "# The closed fleet loop: learning curve",
        "",
        f"Profile `{doc.get('profile')}`, commit `{doc.get('commit')}`, {doc.get('description')}.",
        "Ratios to `minrtt` on the same trip [95 % bootstrap CI]; method in "
        "`bench/polycorn_bench/loop.py` and docs/benchmarks.md.",
        "",
        "## Table used and failures per trip",
        "",
        "| trip | learned table (version, entries) | failures in the trip | in learned-table cells "
        "| position error (median, m) | oracle table entries | handovers: event log / LinkDB "
        "(all trips) | proxy's table at the end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["trips"]:
        tb, ho = t["table"], t.get("handovers") or {}
        ver = f"v{tb['version']}, {tb['entries']}" if tb.get("version") is not None else "none"
        err = tb.get("position_error_m_median")
        out.append(
            f"| {t['trip']} | {ver} | {tb['failures']} | {tb['failures_in_table_cells']} | "
            f"{'–' if err is None else f'{err:.0f}'} | {t['truth_table']['entries']} | "
            f"{ho.get('events_all_trips', '–')} / {ho.get('linkdb', '–')} | {_in_use(t)} |"
        )
    for title, key, ci, n in (
        ("Bulk goodput × minrtt", "goodput_vs_minrtt", "goodput_ci95", "n_pairs"),
        (
            "Recovery after failed handovers × minrtt (ratio of means)",
            "hof_recovery_vs_minrtt",
            "hof_recovery_ci95",
            "hof_n",
        ),
    ):
        out += [
            "",
            f"## {title}",
            "",
            "| trip | " + " | ".join(f"`{v}`" for v in VARIANTS) + " | n |",
            "|---|" + "---|" * (len(VARIANTS) + 1),
        ]
        rows = [(str(t["trip"]), t["variants"]) for t in doc["trips"]]
        pooled = doc.get("pooled_learned_trips")
        if pooled:
            rows.append(
                (f"pooled, trips with a table ({len(pooled['trips'])})", pooled["variants"])
            )
        for label, vs in rows:
            cells = [_fmt(vs[v][key], vs[v][ci]) for v in VARIANTS]
            out.append(f"| {label} | " + " | ".join(cells) + f" | {vs[LEARNED][n]} |")
    out += [
        "",
        "## hof-reject rejections (proxy / relay)",
        "",
        "| trip | " + " | ".join(f"`{v}`" for v in VARIANTS) + " |",
        "|---|" + "---|" * len(VARIANTS),
    ]
    for t in doc["trips"]:
        r = t.get("hof_reject_rejections") or {}
        cells = [
            f"{(r.get(v) or {}).get('proxy', '–')} / {(r.get(v) or {}).get('relay', '–')}"
            for v in VARIANTS
        ]
        out.append(f"| {t['trip']} | " + " | ".join(cells) + " |")
    out += ["", "## Backlogged download × minrtt", "", "| trip | " + " | ".join(VARIANTS) + " |"]
    out.append("|---|" + "---|" * len(VARIANTS))
    for t in doc["trips"]:
        out.append(
            f"| {t['trip']} | "
            + " | ".join(_fmt(t["variants"][v]["backlog_vs_minrtt"]) for v in VARIANTS)
            + " |"
        )
    issues = doc.get("issues", {})
    if issues.get("total"):
        out += ["", f"Input problems skipped: {issues['total']} ({issues.get('by_kind')})."]
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], directory: Path) -> Path:
    """The learning curve: goodput and recovery ratios per trip, one line per variant."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    trips = doc["trips"]
    x = np.arange(1, len(trips) + 1, dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    style = {
        LEARNED: ("tab:blue", "o", "learned table"),
        NONE: ("tab:gray", "s", "no table"),
        TRUTH: ("tab:green", "^", "oracle table"),
    }
    for ax, key, ci_key, title in (
        (axes[0], "goodput_vs_minrtt", "goodput_ci95", "bulk goodput × minrtt"),
        (axes[1], "hof_recovery_vs_minrtt", "hof_recovery_ci95", "recovery after failure × minrtt"),
    ):
        for j, v in enumerate(VARIANTS):
            colour, marker, label = style[v]
            vals, lo, hi = [], [], []
            for t in trips:
                s = t["variants"][v]
                val, ci = s.get(key), s.get(ci_key)
                vals.append(np.nan if val is None else val)
                ok = val is not None and ci and ci[0] is not None and ci[1] is not None
                lo.append(val - ci[0] if ok else 0.0)
                hi.append(ci[1] - val if ok else 0.0)
            ax.errorbar(
                x + (j - 1) * 0.12,
                vals,
                yerr=[lo, hi],
                color=colour,
                marker=marker,
                capsize=3,
                label=label,
                linewidth=1.2 if v == LEARNED else 0.8,
            )
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
        # Ratios: a log scale treats ×2 and ×0.5 alike; intervals of a handful of
        # pairs can be huge, so the axis is clipped and says so.
        ax.set_yscale("log")
        ax.set_ylim(Y_MIN, Y_MAX)
        ticks = [0.25, 0.5, 1.0, 2.0, 4.0]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_title(title)
        ax.set_xlabel("trip")
        ax.set_xticks(x)
        n_key = "n_pairs" if key == "goodput_vs_minrtt" else "hof_n"
        ax.set_xticklabels(
            [
                f"{t['trip']}\n"
                + (f"{t['table']['entries']} cells" if t["table"]["version"] else "no table")
                + f"\nn={t['variants'][LEARNED][n_key]}"
                for t in trips
            ],
            fontsize=8,
        )
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"ratio to minrtt (95 % CI, cut at {Y_MIN:g}–{Y_MAX:g})")
    axes[0].legend(fontsize=8)
    fig.suptitle("Closed fleet loop: hrsch with the table learned so far", fontsize=10)
    fig.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / PLOT_FILE
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def text_table(doc: dict[str, Any]) -> str:
    lines = [f"{'trip':>4} {'table':>10} {'fail':>4}  " + "  ".join(f"{v:>24}" for v in VARIANTS)]
    for t in doc["trips"]:
        tb = t["table"]
        table = f"v{tb['version']}/{tb['entries']}" if tb["version"] is not None else "none"
        cells = [
            f"{_fmt(t['variants'][v]['goodput_vs_minrtt']):>5} hof "
            f"{_fmt(t['variants'][v]['hof_recovery_vs_minrtt']):>5} (n={t['variants'][v]['hof_n']})"
            for v in VARIANTS
        ]
        lines.append(
            f"{t['trip']:>4} {table:>10} {tb['failures']:>4}  "
            + "  ".join(f"{c:>24}" for c in cells)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn_bench.loop", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="raw run directory of bench-loop (with run.json)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output ({DEFAULT_OUT})")
    p.add_argument("--md", type=Path, help="write the markdown report here")
    p.add_argument("--plots", type=Path, help=f"write {PLOT_FILE} into this directory")
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    args = p.parse_args(argv)
    try:
        run = read_run(args.run_dir)
    except (OSError, ValueError) as e:
        print(f"polycorn_bench.loop: cannot read run {args.run_dir}: {e}", file=sys.stderr)
        return 2
    doc = analyse_loop(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown(doc), encoding="utf-8")
    if args.plots and doc["trips"]:
        plot(doc, args.plots)
    if run.issues.total:
        print(
            f"polycorn_bench.loop: {run.issues.total} input problem(s) skipped: "
            + ", ".join(f"{k} ×{v}" for k, v in run.issues.counts.items()),
            file=sys.stderr,
        )
    if not args.quiet:
        print(text_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
