"""The learning curve of the closed fleet loop (``make bench-loop``).

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.loop RUN_DIR \\
        [--out bench/out/loop.json] [--md bench/out/loop.md] [--plots docs/img/loop] [--quiet]

``RUN_DIR`` is what ``python -m polycorn_benchrun.loop`` leaves: the layout of a bench-hsr run (see
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
used, and how far the entry's position is from the failure's start. The document starts with
the run's provenance, as ``polycorn_bench.hsr``'s does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench import hrsch, loop_curve, loop_delay, provenance
from polycorn_bench.analysis import (
    _json_safe,
    backlog_summary,
    bulk_summary,
    size_labels,
)
from polycorn_bench.flows import OVERALL, REFERENCE, Flow, collect_backlogs, collect_flows
from polycorn_bench.loop_curve import (
    HOF_FIELD,
    LEAD_S,
    NOMINAL_SPEED_MPS,
    T1_S,
    T2_S,
    WINDOW_TRIPS,
    Fixes,
    Pairs,
    TripSample,
    read_fixes,
    share,
)
from polycorn_bench.loop_plots import GAIN_FILE, LEARNING_FILE, PLOT_FILE, plot_all
from polycorn_bench.records import (
    HandoverFailure,
    LinkSetRun,
    Run,
    TripRun,
    read_failure_table,
    read_run,
)

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
    "known_failure_share": (
        "learned_/oracle_known_failure_share: failures of the trip in cells the table has an "
        "entry for / failures of the trip, Wilson 95 % interval (no table: 0)"
    ),
    "correct_share": (
        "learned_/oracle_correct_share: failures in tabled cells whose start x was in paper "
        "§3's window with HPR's lead, Δ = sign·(x − L̂)/v in [t1 − lead, t2 − lead] (t1 0 s, "
        "t2 2.5 s, lead 0.44 s; L̂ the entry's position_m, v the last GPS fix's speed at "
        "most 10 s before the failure, else 83.3 m/s), / all failures of the trip, Wilson 95 % "
        "interval; table.failures_correct/early/late and delta_s give the classes (late: Δ "
        "below the window or no entry; early: above)"
    ),
    "hof_recovery_learned/oracle/none": (
        "per trip, the variants' hof_recovery_vs_minrtt with its interval (as in variants)"
    ),
    "gain": (
        "hof_recovery_gain / goodput_gain: gain of a variant = its ratio to minrtt minus "
        "hrsch-none's, on the failure windows (downloads) all three hrsch variants have; "
        "half_oracle_excess = gain_learned − gain_oracle/2 with a 95 % percentile bootstrap "
        "CI of the windows (downloads), 10000 resamples, fixed seed"
    ),
    "running": (
        "running.cumulative[k]: the per-trip numbers pooled over trips 1..k (shares over all "
        "their failures, ratios over all their windows); running.window[k]: pooled over the "
        "last window_trips trips up to k"
    ),
}


def cell_id(carrier: int, cell: int) -> int:
    """The data plane's (and LinkDB's) ID of a testbed cell."""
    return (carrier + 1) << 32 | cell


@dataclass(frozen=True)
class Table:
    """The entries of a failure-location table: cell ID -> (position_m, failures), and the
    direction of travel of the entries that say "decreasing" (-1; otherwise +1)."""

    version: int | None
    entries: dict[int, tuple[float, int | None]]
    signs: dict[int, int] = field(default_factory=dict)

    def sign(self, cell: int) -> int:
        """+1 when the entry's direction of travel is increasing track_m, -1 decreasing."""
        return self.signs.get(cell, 1)


def read_table(path: Path) -> Table | None:
    """A ``polycorn-failure-table/1`` file, or None when absent or unusable."""
    doc = read_failure_table(path)
    if doc is None:
        return None
    version, rows = doc
    entries: dict[int, tuple[float, int | None]] = {}
    signs: dict[int, int] = {}
    for e in rows:
        entries[e.cell] = (e.position_m, e.failures)
        if e.direction == "decreasing":
            signs[e.cell] = -1
        else:
            signs.pop(e.cell, None)
    return Table(version, entries, signs)


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


def timing(
    failures: list[HandoverFailure],
    table: Table | None,
    fixes: Fixes | None,
    lead_s: float = LEAD_S,
) -> dict[str, Any]:
    """Paper §3's classes of the trip's failures against the table, with HPR's lead (the
    trainer's ``validation.with_lead``, docs/trainer.md): for a failure in a tabled cell,
    Δ = sign · (x − L̂) / v, with x the failure's start (``handover_start`` ``track_m``), L̂
    the entry's ``position_m``, sign −1 for a "decreasing" entry and v the speed of the
    trip's last GPS fix at most 10 s before the failure (83.3 m/s without one, counted in
    ``speed_fallbacks``). Correct for Δ in [t1 − lead, t2 − lead] = [−lead, 2.5 s − lead];
    early above; late below, or without an entry for the cell. A tabled failure without a
    position is in none of the three (``failures_without_position``)."""
    correct = early = late = no_position = fallbacks = 0
    deltas: list[float] = []
    lo, hi = T1_S - lead_s, T2_S - lead_s
    for f in failures:
        cell = None if f.carrier is None or f.from_cell is None else cell_id(f.carrier, f.from_cell)
        hit = None if table is None or cell is None else table.entries.get(cell)
        if hit is None or cell is None or table is None:
            late += 1
            continue
        if f.track_m is None:
            no_position += 1
            continue
        v = fixes.speed_at(f.t_ms) if fixes is not None else None
        if v is None:
            fallbacks += 1
            v = NOMINAL_SPEED_MPS
        d = table.sign(cell) * (f.track_m - hit[0]) / v
        deltas.append(d)
        if d < lo:
            late += 1
        elif d > hi:
            early += 1
        else:
            correct += 1
    return {
        "failures_correct": correct,
        "failures_early": early,
        "failures_late": late,
        "failures_without_position": no_position,
        "speed_fallbacks": fallbacks,
        "delta_s": sorted(round(d, 3) for d in deltas),
    }


@dataclass
class _Numbers:
    """The ratios of the variants over some trips, and the paired samples behind them."""

    variants: dict[str, dict[str, Any]]
    failures: int
    #: Per variant: failure window -> (goodput, minrtt's goodput) in the 2 s after it.
    hof: dict[str, Pairs]
    #: Per variant: bulk download (trip, id) -> (goodput, minrtt's goodput).
    goodput: dict[str, Pairs]


def _goodput_pairs(flows: list[Flow], scheme: str) -> Pairs:
    """As ``flows.paired_goodputs`` (the pairs of the bulk ratio), keyed by download."""
    ref = {
        f.pair_key: g for f in flows if f.scheme == REFERENCE and (g := f.goodput_mbps) is not None
    }
    out: Pairs = {}
    for f in flows:
        g, r = f.goodput_mbps, ref.get(f.pair_key)
        if f.scheme == scheme and g is not None and r is not None and r > 0:
            out.setdefault(f.pair_key, (g, r))
    return out


def _variant_numbers(ls: LinkSetRun, run: Run) -> _Numbers:
    """Goodput, recovery and backlog of each variant against minrtt over ``ls``'s trips."""
    flows = collect_flows(ls, run, with_oracle=False)
    backlogs = collect_backlogs(ls, run.issues)
    schemes = [s for s in run.schemes if s in (REFERENCE, *VARIANTS)]
    bulk = bulk_summary(flows, schemes, size_labels(run))
    hof, _ = hrsch.hof_recovery(flows, ls, schemes, backlogs)
    back = backlog_summary(backlogs, schemes) or {}
    by_scheme = (hof or {}).get("by_scheme", {})
    out: dict[str, dict[str, Any]] = {}
    windows: dict[str, Pairs] = {}
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
        windows[v] = {
            (w["trip"], w["t_ms"], w["carrier"], w["source"], w["id"]): (
                w["goodput_mbps"],
                w["minrtt_goodput_mbps"],
            )
            for w in h.get("windows", [])
        }
    return _Numbers(
        variants=out,
        failures=(hof or {}).get("n_failures", 0),
        hof=windows,
        goodput={v: _goodput_pairs(flows, v) for v in VARIANTS},
    )


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


def _table_counts(
    failures: list[HandoverFailure] | None,
    table: Table | None,
    used: bool,
    fixes: Fixes | None,
    lead_s: float,
) -> tuple[dict[str, Any], int | None, int | None]:
    """(coverage and timing of the table, failures in its cells, failures it had correct).
    ``used``: a table was in use on the trip; without its file the counts are unknown (None).
    Without a table (``used`` false) nothing is known and nothing is correct."""
    fs = failures or []
    block = {**coverage(fs, table), **timing(fs, table, fixes, lead_s)}
    if failures is None or (used and table is None):
        return block, None, None
    return block, block["failures_in_table_cells"], block["failures_correct"]


def _shares(prefix: str, known: int | None, correct: int | None, n: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what, k in (("known_failure_share", known), ("correct_share", correct)):
        x, ci = share(k, n)
        out[f"{prefix}_{what}"] = x
        out[f"{prefix}_{what}_ci95"] = ci
    return out


def _timeline(run: Run, trip: TripRun) -> list[loop_delay.Seen]:
    """The learned copy's proxy's table versions during the trip (none recorded: empty)."""
    timeline, bad = loop_delay.read_timeline(trip.trip_dir.parent / "table-timeline.jsonl")
    for _ in range(bad):
        run.issues.add("unreadable table-timeline line", trip.name)
    return timeline


def _wall_clock_failures(
    trip: TripRun, meta: dict[str, Any], index: int
) -> list[loop_delay.Failure]:
    """The trip's failed handovers on the wall clock (its epoch + their start), by cell."""
    epoch = meta.get("epoch_unix_ms")
    if not isinstance(epoch, int):
        return []
    return [
        loop_delay.Failure(
            t_unix_ms=epoch + int(f.t_ms),
            cell=cell_id(f.carrier, f.from_cell),
            trip=meta.get("trip", index),
            train=meta.get("train"),
        )
        for f in trip.handover_failures or []
        if f.carrier is not None and f.from_cell is not None
    ]


def _delays(
    run: Run, failures: list[loop_delay.Failure], timelines: list[list[loop_delay.Seen]]
) -> dict[str, Any] | None:
    """From each failure to the table carrying it (:mod:`polycorn_bench.loop_delay`), or
    None for a run that kept no table versions."""
    path = run.root / "tables.jsonl"
    tables, bad = loop_delay.read_tables(path)
    for _ in range(bad):
        run.issues.add("unreadable tables.jsonl line", str(path))
    if not tables:
        return None
    rows = loop_delay.entry_delays(tables, failures, timelines)
    return {"summary": loop_delay.summarise(rows), "entries": rows}


def analyse_loop(run: Run, lead_s: float = LEAD_S, window: int = WINDOW_TRIPS) -> dict[str, Any]:
    """The ``loop.json`` document."""
    ls = next((x for x in run.link_sets if x.name == LINK_SET), None)
    if ls is None and run.link_sets:
        ls = run.link_sets[0]
    trips_out: list[dict[str, Any]] = []
    samples: list[TripSample] = []
    learned_trips: list[TripRun] = []
    fleet_failures: list[loop_delay.Failure] = []
    timelines: list[list[loop_delay.Seen]] = []
    for index, trip in enumerate(ls.trips if ls else [], start=1):
        assert ls is not None
        meta = _trip_meta(trip)
        timelines.append(_timeline(run, trip))
        fleet_failures += _wall_clock_failures(trip, meta, index)
        one = replace(ls, trips=[trip])
        nums = _variant_numbers(one, run)
        failures = trip.handover_failures
        n_fail = None if failures is None else len(failures)
        fixes = read_fixes(trip.trip_dir / "events.jsonl")
        learned = read_table(trip.trip_dir.parent / "failure-table-learned.json")
        truth = read_table(trip.trip_dir.parent / "failure-table-truth.json")
        lt = meta.get("learned_table")
        if learned is not None:
            learned_trips.append(trip)
        used = isinstance(lt, dict) or learned is not None
        l_block, l_known, l_correct = _table_counts(failures, learned, used, fixes, lead_s)
        t_block, t_known, t_correct = _table_counts(failures, truth, True, fixes, lead_s)
        number = meta.get("trip", index)
        sample = TripSample(
            trip=number if isinstance(number, int) else index,
            failures=n_fail,
            known={"learned": l_known, "oracle": t_known},
            correct={"learned": l_correct, "oracle": t_correct},
            hof=nums.hof,
            goodput=nums.goodput,
        )
        samples.append(sample)
        main = nums.variants[LEARNED]
        recovery: dict[str, Any] = {}
        for v in VARIANTS:
            recovery[HOF_FIELD[v]] = nums.variants[v]["hof_recovery_vs_minrtt"]
            recovery[f"{HOF_FIELD[v]}_ci95"] = nums.variants[v]["hof_recovery_ci95"]
        trips_out.append(
            {
                "trip": number,
                "id": trip.name,
                "train": meta.get("train"),
                "trip_seed": meta.get("trip_seed"),
                "hrsch_vs_minrtt": main["goodput_vs_minrtt"],
                "hrsch_vs_minrtt_ci95": main["goodput_ci95"],
                "n": main["n_pairs"],
                "hof_recovery_vs_minrtt": main["hof_recovery_vs_minrtt"],
                "hof_recovery_ci95": main["hof_recovery_ci95"],
                "hof_n": main["hof_n"],
                **_shares("learned", l_known, l_correct, n_fail),
                **_shares("oracle", t_known, t_correct, n_fail),
                **recovery,
                "hof_recovery_gain": loop_curve.gain_test(nums.hof, "hof_recovery"),
                "goodput_gain": loop_curve.gain_test(nums.goodput, "goodput"),
                "table": {
                    "version": lt.get("version") if isinstance(lt, dict) else None,
                    **l_block,
                },
                "truth_table": t_block,
                "variants": {v: nums.variants[v] for v in VARIANTS},
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
            "failures": nums.failures,
            "variants": {v: nums.variants[v] for v in VARIANTS},
        }
    curves = loop_curve.running(samples, window) if samples else None
    delays = _delays(run, fleet_failures, timelines)
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
        "running": curves,
        "half_oracle_gain_trip": loop_curve.half_oracle_gain(curves) if curves else None,
        "delays": delays,
        "parameters": {
            "lead_s": lead_s,
            "t1_s": T1_S,
            "t2_s": T2_S,
            "nominal_speed_mps": NOMINAL_SPEED_MPS,
            "window_trips": window,
        },
        "methods": METHODS,
        "issues": run.issues.to_json(),
    }
    result = _json_safe(doc)
    assert isinstance(result, dict)
    return result


def _bounds(ci: object) -> tuple[float, float] | None:
    """An interval ``[lo, hi]`` read from the JSON, or None."""
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(c, int | float) for c in ci):
        return float(ci[0]), float(ci[1])
    return None


def _fmt(x: object, ci: object = None) -> str:
    if not isinstance(x, int | float):
        return "–"
    s = f"{x:.2f}"
    if (b := _bounds(ci)) is not None:
        s += f" [{b[0]:.2f}, {b[1]:.2f}]"
    return s


def _in_use(t: dict[str, Any]) -> str:
    u = t.get("table_in_use_at_end") or {}
    v, n = u.get("proxy_version"), u.get("proxy_entries")
    if not isinstance(v, int | float) or v <= 0:
        return "none"
    return f"v{v:.0f}, {n:.0f}" if isinstance(n, int | float) else f"v{v:.0f}"


def _pct(x: object, ci: object = None) -> str:
    if not isinstance(x, int | float):
        return "–"
    s = f"{100 * x:.0f} %"
    if (b := _bounds(ci)) is not None:
        s += f" [{100 * b[0]:.0f}, {100 * b[1]:.0f}]"
    return s


def _share(row: dict[str, Any], key: str) -> str:
    return _pct(row.get(key), row.get(f"{key}_ci95"))


def _gain(g: object) -> str:
    if not isinstance(g, dict) or g.get("half_oracle_excess") is None:
        return "–"
    share = g.get("learned_share_of_oracle")
    return (
        f"{_fmt(g.get('learned'))} / {_fmt(g.get('oracle'))}"
        f" ({'–' if share is None else f'{100 * share:.0f} %'});"
        f" {_fmt(g.get('half_oracle_excess'), g.get('half_oracle_excess_ci95'))}"
    )


def _markdown_curve(doc: dict[str, Any]) -> list[str]:
    """Table quality per trip, the running curves and half of the oracle's gain."""
    par = doc.get("parameters") or {}
    out = [
        "",
        f"## Table quality per trip (HPR's lead {par.get('lead_s', LEAD_S):g} s)",
        "",
        "Share of the trip's failures [Wilson 95 %]: in a cell of the table (known), and in "
        "paper §3's window with HPR's lead (correct); the classes of the learned table's "
        "failures; the oracle's for comparison (no table: 0).",
        "",
        "| trip | failures | learned: known | learned: correct | learned: correct / early / "
        "late | oracle: known | oracle: correct | speed fallbacks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in doc["trips"]:
        tb = t["table"]
        out.append(
            f"| {t['trip']} | {tb['failures']} | {_share(t, 'learned_known_failure_share')} | "
            f"{_share(t, 'learned_correct_share')} | "
            f"{tb.get('failures_correct', '–')} / {tb.get('failures_early', '–')} / "
            f"{tb.get('failures_late', '–')} | {_share(t, 'oracle_known_failure_share')} | "
            f"{_share(t, 'oracle_correct_share')} | {tb.get('speed_fallbacks', '–')} |"
        )
    curves = doc.get("running")
    if curves:
        for key, title in (
            ("cumulative", "trips 1..k"),
            ("window", f"the last {curves.get('window_trips')} trips up to k"),
        ):
            out += [
                "",
                f"## Running curve: pooled over {title}",
                "",
                "Shares [Wilson 95 %]; recovery after failed handovers × minrtt (ratio of "
                "means [95 % bootstrap CI]); recovery gain over no table, learned / oracle "
                "(learned's share of the oracle's), and gain_learned − gain_oracle/2 [CI] "
                "on the windows all variants have.",
                "",
                "| k | failures | learned: known | learned: correct | oracle: correct | "
                "recovery: learned | none | oracle | n | gain learned / oracle; excess [CI] |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for r in curves.get(key) or []:
                out.append(
                    f"| {r['trip']} | {r['failures']} | "
                    f"{_share(r, 'learned_known_failure_share')} | "
                    f"{_share(r, 'learned_correct_share')} | {_share(r, 'oracle_correct_share')} | "
                    + " | ".join(
                        _fmt(r[HOF_FIELD[v]], r[f"{HOF_FIELD[v]}_ci95"])
                        for v in (LEARNED, NONE, TRUTH)
                    )
                    + f" | {r[HOF_FIELD[LEARNED] + '_n']} | {_gain(r['hof_recovery_gain'])} |"
                )
    half = doc.get("half_oracle_gain_trip")
    if half:
        out += [
            "",
            "## Half of the oracle's gain",
            "",
            f"Definition: {half['definition']}",
            "",
            "| gain | curve | point | lower bound | first point | at the last trip: learned /"
            " oracle (share); excess [CI] |",
            "|---|---|---|---|---|---|",
        ]
        for kind in loop_curve.GAIN_KINDS:
            for curve, per in (half.get(kind) or {}).items():
                last = per.get("at_last_trip") or {}
                out.append(
                    f"| {kind} | {curve} | {per.get('point') or 'not reached'} | "
                    f"{per.get('lower_bound') or 'not reached'} | "
                    f"{per.get('first_point') or '–'} | {_gain(last)} |"
                )
        out += ["", f"Caveat: {half['caveat']}"]
    return out


def _markdown_delays(doc: dict[str, Any]) -> list[str]:
    """The delays from a failure to the table carrying it, per kind of update."""
    d = doc.get("delays")
    if not d:
        return []
    s = d["summary"]

    def q(x: dict[str, Any]) -> str:
        if not x["n"]:
            return "–"
        return f"{x['median']:.1f} s / {x['p90']:.1f} s / {x['max']:.1f} s (n {x['n']})"

    out = [
        "",
        "## From a failure to the table carrying it (median / 90th percentile / max)",
        "",
        "| update | entries | to LinkDB | to a running proxy |",
        "|---|---|---|---|",
        f"| all | {s['entries']} | {q(s['to_linkdb_s'])} | {q(s['to_proxy_s'])} |",
    ]
    for kind, b in s["by_update"].items():
        out.append(f"| {kind} | {b['entries']} | {q(b['to_linkdb_s'])} | {q(b['to_proxy_s'])} |")
    out += [
        "",
        f"Entries a proxy had only from its start (published between trips): "
        f"{s['at_proxy_start']}; never in a proxy's table: {s['never_at_a_proxy']}; "
        f"without a failure before them: {s['entries_without_a_failure_before']}.",
    ]
    return out


def markdown(doc: dict[str, Any]) -> str:
    """The report: one row per trip, then the pooled numbers."""
    out = [
        "# The closed fleet loop: learning curve",
        "",
        f"Profile `{doc.get('profile')}`, {doc.get('description')}.",
        provenance.describe(doc),
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
    out += _markdown_curve(doc)
    out += _markdown_delays(doc)
    issues = doc.get("issues", {})
    if issues.get("total"):
        out += ["", f"Input problems skipped: {issues['total']} ({issues.get('by_kind')})."]
    return "\n".join(out) + "\n"


def text_table(doc: dict[str, Any]) -> str:
    lines = [
        f"{'trip':>4} {'table':>10} {'fail':>4} {'known':>5} {'corr':>5}  "
        + "  ".join(f"{v:>24}" for v in VARIANTS)
    ]
    for t in doc["trips"]:
        tb = t["table"]
        table = f"v{tb['version']}/{tb['entries']}" if tb["version"] is not None else "none"
        cells = [
            f"{_fmt(t['variants'][v]['goodput_vs_minrtt']):>5} hof "
            f"{_fmt(t['variants'][v]['hof_recovery_vs_minrtt']):>5} (n={t['variants'][v]['hof_n']})"
            for v in VARIANTS
        ]
        lines.append(
            f"{t['trip']:>4} {table:>10} {tb['failures']:>4} "
            f"{_pct(t.get('learned_known_failure_share')):>5} "
            f"{_pct(t.get('learned_correct_share')):>5}  " + "  ".join(f"{c:>24}" for c in cells)
        )
    half = doc.get("half_oracle_gain_trip") or {}
    for kind in loop_curve.GAIN_KINDS:
        cum = (half.get(kind) or {}).get("cumulative")
        if cum:
            lines.append(
                f"half of the oracle's {kind} gain (pooled 1..k): point from trip "
                f"{cum.get('point') or '–'}, lower bound from trip {cum.get('lower_bound') or '–'}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn_bench.loop", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="raw run directory of bench-loop (with run.json)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output ({DEFAULT_OUT})")
    p.add_argument("--md", type=Path, help="write the markdown report here")
    p.add_argument(
        "--plots",
        type=Path,
        help=f"write {PLOT_FILE}, {LEARNING_FILE} and {GAIN_FILE} into this directory",
    )
    p.add_argument(
        "--lead-s",
        type=float,
        default=LEAD_S,
        help=f"HPR's lead for the correct share (s, default {LEAD_S})",
    )
    p.add_argument(
        "--window",
        type=int,
        default=WINDOW_TRIPS,
        help=f"trips of the trailing window of the running curve (default {WINDOW_TRIPS})",
    )
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    args = p.parse_args(argv)
    if args.window < 1 or not math.isfinite(args.lead_s) or args.lead_s < 0:
        p.error("--window must be ≥ 1 and --lead-s a non-negative number")
    try:
        run = read_run(args.run_dir)
    except (OSError, ValueError) as e:
        print(f"polycorn_bench.loop: cannot read run {args.run_dir}: {e}", file=sys.stderr)
        return 2
    prov = provenance.resume(run.meta, args.out, *([args.md] if args.md else []))
    doc = prov.stamp(analyse_loop(run, lead_s=args.lead_s, window=args.window))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown(doc), encoding="utf-8")
    if args.plots and doc["trips"]:
        plot_all(doc, args.plots)
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
