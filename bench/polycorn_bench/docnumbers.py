"""The numbers the docs quote from ``bench/out``, generated instead of copied by hand.

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.docnumbers [--check] [--root DIR]

``README.md`` and ``docs/results.md`` mark each generated region::

    <!-- generated:NAME -->...<!-- /generated -->

Without ``--check`` every region is rewritten from ``bench/out`` (the latest full run
``hsr.json``; the first railway's ``hsr-v1.json``; the precision, trainer and loop results;
for the budget sweep ``bench/out/diagnostics/sweep/hsr.json``) by the renderer of that NAME in
:data:`REGIONS`; the text around the regions is never touched. With ``--check`` nothing is
written: the exit status is 1 when a region differs from what ``bench/out`` gives (each stale
region is listed with its file and line), so a test fails when the docs and the results
disagree. A block region (a table) is written as the marker on its own line, the table, an
empty line and the closing marker; an inline region (a sentence in a paragraph) stays inline.
Exit status 2 for a region with an unknown NAME, an unclosed marker or a missing JSON file.

Which rows a table has, their labels and the emphasis of a few cells are editorial and live
here with the renderer; every number comes from the JSON. Verdicts against the paper are the
JSON's (``polycorn_bench.verdict``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polycorn_bench.hrsch import KERNEL_SCHEMES
from polycorn_bench.verdict import verdict_text

ROOT = Path(__file__).resolve().parents[2]
#: The files whose regions are generated, relative to the repository root.
FILES = (
    "README.md",
    "docs/results.md",
    "docs/results-archive.md",
    "docs/trainer.md",
    "docs/operations.md",
    "docs/testing.md",
)
HSR_JSON = "bench/out/hsr.json"
#: The full profile on the first railway (preset pc-gateway-300-v1, per-packet loss; the run of
#: 2026-11-25/26): the sections of results.md that describe it read this frozen copy, while
#: ``hsr.json`` holds the latest full run (on the new railway).
HSR_V1_JSON = "bench/out/hsr-v1.json"
SWEEP_JSON = "bench/out/diagnostics/sweep/hsr.json"
CONCURRENCY_JSON = "bench/out/hsr-concurrency.json"
SWEEP_NOW_JSON = "bench/out/hsr-sweep.json"
TRAINER_CURVE_JSON = "bench/out/trainer-curve.json"
TRAINER_TRIPS_JSON = "bench/out/trainer-trips.json"
PRECISION_JSON = "bench/out/hsr-precision.json"
LOOP_JSON = "bench/out/loop.json"
#: The precision-profile runs of more schemes: the stale filter and HPR
#: (hsr-mechanisms.json), and minrtt plus each HRSCH mechanism (hsr-ablation.json).
MECHANISMS_JSON = "bench/out/hsr-mechanisms.json"
ABLATION_JSON = "bench/out/hsr-ablation.json"
IM_JSON = "bench/out/hsr-im.json"
#: The mechanisms run's five schemes again after the retransmission timer's fix (Karn's
#: backoff kept until a valid sample, 1 s before any): same trips, load and parallelism.
KARN_JSON = "bench/out/hsr-karn.json"
#: hrsch with one mechanism left out each, beside hrsch and minrtt (precision profile).
LEAVE_ONE_OUT_JSON = "bench/out/hsr-leave-one-out.json"
#: The tail rules beside hrsch+stale, hrsch+hol and minrtt (precision profile, 7 schemes).
TAIL_JSON = "bench/out/hsr-tail.json"
#: The same schemes on 12 of those trips with the next build (receive window start and growth),
#: each scheme against itself (``polycorn_bench.ab``).
WINDOW_AB_JSON = "bench/out/hsr-window-ab.json"
#: The default pipeline beside hrsch (early table), hrsch@mean and minrtt on the precision
#: profile's 31 trips (2026-11-27): the default pipeline's headline.
DEFAULT_JSON = "bench/out/hsr-default.json"
#: Head-of-line recovery on the default pipeline (precision, 2026-11-28): hrsch+,
#: hrsch+pen and hrsch+hol+tail against minrtt.
HOL_DEFAULT_JSON = "bench/out/hsr-hol-default.json"
#: CUBIC against BBR on the subflows, side by side in one precision run (scheme NAME~cubic).
CC_SAME_RUN_JSON = "bench/out/hsr-cc.json"
#: Diagnostic CC: CUBIC against BBR on the subflows (polycorn_bench.diagnostics.cc_compare).
CC_JSON = "bench/out/diagnostics/cc/compare.json"
#: The kernel-MPTCP baselines after the tunnel's fix (no endpoint RTO or window over kernel
#: MPTCP) beside minrtt and the default pipeline, precision profile (2026-11-27).
KERNEL_MPTCP_JSON = "bench/out/hsr-kernel-mptcp.json"
#: Recovery after failed handovers alone (``PROFILE=recovery``).
RECOVERY_JSON = "bench/out/hsr-recovery.json"
#: hof-reject's holds replayed on that run (``polycorn_bench.holds --all``).
HOLDS_JSON = "bench/out/hsr-holds.json"
#: ``make bench-fleet``: one cloud node under 10 … 100 trains.
FLEET_JSON = "bench/out/fleet.json"
#: TLS over TCP against QUIC subflows: a backlogged download on 31 trips, and bulk downloads on
#: 10 trips against the oracle, kernel MPTCP and the passenger's own TCP.
TRANSPORT_JSON = "bench/out/hsr-transport.json"
#: The cloud side under load: ingest into LinkDB, map matching, the LinkDB API.
INGEST_JSON = "bench/out/ingest.json"
MATCHING_JSON = "bench/out/matching.json"
API_JSON = "bench/out/api.json"
TRANSPORT_BULK_JSON = "bench/out/hsr-transport-bulk.json"
#: ``make fuzz``: every fuzz target under honggfuzz (scripts/fuzz.py).
FUZZ_JSON = "bench/out/fuzz.json"
#: ``make chaos``: the fault campaign (testbed/chaos).
CHAOS_JSON = "bench/out/chaos.json"

#: The default pipeline of the runs whose JSON does not name it (written before
#: ``default_scheme`` was recorded, when it was ``hrsch+stale``); newer files name theirs.
UNRECORDED_DEFAULT = "hrsch+stale"

_REGION = re.compile(
    r"<!-- generated:(?P<name>[a-z0-9-]+) -->(?P<body>.*?)<!-- /generated -->", re.DOTALL
)
_OPEN = re.compile(r"<!-- generated:([a-z0-9-]+) -->")
_CLOSE = "<!-- /generated -->"
MINUS = "−"


class DocError(Exception):
    """A marker or source problem: exit status 2."""


# --- formatting ------------------------------------------------------------------------------


def num(x: float | None, digits: int = 2) -> str:
    """A number with a typographic minus; '–' for none."""
    if x is None:
        return "–"
    s = f"{x:.{digits}f}"
    return s.replace("-", MINUS) if not _is_zero(s) else s.lstrip("-")


def _is_zero(s: str) -> bool:
    return s.lstrip("-").strip("0.") == ""


def signed(x: float, digits: int) -> str:
    """'+5.6' / '−10.2'; a value that rounds to zero has no sign."""
    s = f"{x:+.{digits}f}"
    if _is_zero(s.lstrip("+")):
        return s[1:]
    return s.replace("-", MINUS)


def ratio_ci(r: float | None, ci: Sequence[float | None] | None, digits: int = 2) -> str:
    """'0.97 [0.90, 1.02]'; the bare ratio without an interval."""
    if r is None:
        return "–"
    if not ci or ci[0] is None or ci[1] is None:
        return num(r, digits)
    return f"{num(r, digits)} [{num(ci[0], digits)}, {num(ci[1], digits)}]"


def interval(ci: Sequence[float | None] | None, digits: int = 2) -> str:
    """'[0.90, 1.02]'; '–' without both bounds."""
    if not ci or ci[0] is None or ci[1] is None:
        return "–"
    return f"[{num(ci[0], digits)}, {num(ci[1], digits)}]"


def pct(x: float | None, digits: int = 1, plus: bool = True) -> str:
    """'+5.6 %' / '−10.2 %' (``plus``: a sign on positive numbers)."""
    if x is None:
        return "–"
    return f"{signed(x * 100, digits) if plus else num(x * 100, digits)} %"


def pct_ci(x: float | None, ci: Sequence[float | None] | None, digits: int = 1) -> str:
    """'−10.2 % [−15.9, −4.5]'."""
    if x is None:
        return "–"
    if not ci or ci[0] is None or ci[1] is None:
        return pct(x, digits)
    return f"{pct(x, digits)} [{signed(ci[0] * 100, digits)}, {signed(ci[1] * 100, digits)}]"


def sig2(x: float) -> str:
    """A share in per cent with two significant digits: 5.7, 0.66, 0.31."""
    v = x * 100
    if v == 0:
        return "0"
    digits = max(0, 1 - math.floor(math.log10(abs(v))))
    return num(v, digits)


def commit_of(doc: dict[str, Any]) -> str:
    """A result's commit as the docs quote it: its first 12 hex digits (the JSON has all 40)."""
    commit = doc.get("commit")
    return commit[:12] if isinstance(commit, str) else str(commit)


def bold(s: str, on: bool = True) -> str:
    return f"**{s}**" if on else s


def resolved(ci: Sequence[float | None] | None, null: float) -> bool:
    """The interval excludes ``null`` (1 for ratios, 0 for gains)."""
    if not ci or ci[0] is None or ci[1] is None:
        return False
    return ci[0] > null or ci[1] < null


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    lines = [line(header), "|" + "|".join("---" for _ in header) + "|"]
    lines += [line(r) for r in rows]
    return "\n".join(lines)


def code(scheme: str) -> str:
    return f"`{scheme}`"


def words(v: str | None) -> str:
    """A verdict in words, bold when below the paper (as in the report)."""
    text = verdict_text(v)
    return bold(text, v == "below")


def goal_words(v: str | None) -> str:
    """A verdict against our goal in words, bold when below it."""
    return bold(verdict_text(v).replace("the paper", "the goal"), v == "below")


def _get(d: Any, *path: str) -> Any:
    """``d[path[0]][path[1]]...``, None where a level is missing."""
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


# --- sources ---------------------------------------------------------------------------------


@dataclass
class Sources:
    """The JSON documents the regions are generated from (loaded when first needed)."""

    root: Path
    _cache: dict[str, Any]
    #: The full run that :attr:`hsr` and :meth:`link_set` read.
    hsr_rel: str

    def __init__(
        self, root: Path, hsr_rel: str = HSR_JSON, cache: dict[str, Any] | None = None
    ) -> None:
        self.root = root
        self._cache = {} if cache is None else cache
        self.hsr_rel = hsr_rel

    def on(self, rel: str) -> Sources:
        """The same sources (and cache) with :attr:`hsr` reading the full run ``rel``."""
        return Sources(self.root, rel, self._cache)

    def load(self, rel: str) -> dict[str, Any]:
        if rel not in self._cache:
            path = self.root / rel
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise DocError(f"{rel}: {e}") from e
            if not isinstance(doc, dict):
                raise DocError(f"{rel}: not a JSON object")
            self._cache[rel] = doc
        result: dict[str, Any] = self._cache[rel]
        return result

    @property
    def hsr(self) -> dict[str, Any]:
        return self.load(self.hsr_rel)

    def link_set(self, name: str) -> dict[str, Any]:
        ls = _get(self.hsr, "link_sets", name)
        if not isinstance(ls, dict):
            raise DocError(f"{self.hsr_rel}: no link set {name!r}")
        return ls


def on(rel: str, render: Callable[[Sources], str]) -> Callable[[Sources], str]:
    """``render`` reading the full run ``rel`` as :attr:`Sources.hsr`."""

    def on_rel(src: Sources) -> str:
        return render(src.on(rel))

    return on_rel


# --- renderers -------------------------------------------------------------------------------


AGGREGATION_ROWS = (
    ("minrtt", "`minrtt`"),
    ("hrsch", "`hrsch`"),
    ("ecf", "`ecf`"),
    ("blest", "`blest`"),
    ("redundant", "`redundant`"),
    ("roundrobin", "`roundrobin`"),
    ("single-path", "`single-path` (carriers by passenger)"),
    ("kernel-mptcp", "`kernel-mptcp` (one MPTCP tunnel)"),
    ("kernel-mptcp-conn", "`kernel-mptcp-conn` (MPTCP per connection)"),
)


def aggregation(src: Sources) -> str:
    d = src.hsr
    n = max(d["backlog"][s]["n_trips"] for s, _ in AGGREGATION_ROWS)
    rows = []
    for s, label in AGGREGATION_ROWS:
        b = d["backlog"][s]
        best = d["best_single_carrier"]["by_scheme"][s]
        vs_min = "1.00" if s == "minrtt" else ratio_ci(b["ratio_vs_minrtt"], b["ci95"])
        rows.append(
            [
                label,
                num(b["goodput_mbps_mean"], 1),
                bold(ratio_ci(best["ratio"], best["ci95"]), s == "minrtt"),
                vs_min,
            ]
        )
    return table(["scheme", f"Mbit/s (mean of {n})", "× best single carrier", "× `minrtt`"], rows)


def _carrier(scheme: str) -> str:
    return "carrier " + scheme.removeprefix("single-path-c")


def capacity_trips(src: Sources) -> str:
    d = src.hsr
    ref = {r["trip"]: r for r in d["best_single_carrier"]["reference"]}
    rows = []
    for t in d["capacity_use"]["trips"]:
        r = ref.get(t["trip"])
        rows.append(
            [
                t["trip"],
                " / ".join(num(c, 1) for c in t["carriers_mbps"]),
                num(t["ceiling"]),
                "–" if r is None else f"{_carrier(r['scheme'])} ({num(r['goodput_mbps'], 1)})",
            ]
        )
    rows.append(["geometric mean", "", bold(num(d["capacity_use"]["ceiling"])), ""])
    return table(
        ["trip", "carrier 0 / carrier 1, Mbit/s", "ceiling", "better alone (goodput)"], rows
    )


CAPACITY_SHARE_ROWS = (
    ("single-path-c0", "`single-path-c0` (carrier 0 alone)"),
    ("single-path-c1", "`single-path-c1` (carrier 1 alone)"),
    ("minrtt", "`minrtt`"),
    ("ecf", "`ecf`"),
    ("kernel-mptcp-conn", "`kernel-mptcp-conn`"),
    ("hrsch", "`hrsch`"),
    ("kernel-mptcp", "`kernel-mptcp`"),
)


def capacity_share(src: Sources) -> str:
    by = src.hsr["capacity_use"]["by_scheme"]
    rows = [[label, ratio_ci(by[s]["ratio"], by[s]["ci95"])] for s, label in CAPACITY_SHARE_ROWS]
    return table(["scheme", "goodput / capacity [95 % CI]"], rows)


CONCURRENCY_SCHEMES = ("minrtt", "hrsch", "kernel-mptcp-conn", "single-path-c0", "single-path-c1")
#: The concurrency profile's (``hsr-concurrency.json``): the default pipeline for hrsch.
CONCURRENCY_NOW_SCHEMES = (
    "minrtt",
    "hrsch+",
    "kernel-mptcp-conn",
    "single-path-c0",
    "single-path-c1",
)


def concurrency(src: Sources, schemes: tuple[str, ...] = CONCURRENCY_SCHEMES) -> str:
    conc = src.hsr["concurrency"]
    rows = []
    for n in sorted(conc, key=int):
        for s in schemes:
            c = conc[n].get(s)
            if c is None:
                continue
            budget = (
                "–"
                if s in KERNEL_SCHEMES
                else f"{num(c['relay_budget_peak_mb'], 0)} / {num(c['proxy_budget_peak_mb'], 0)}"
            )
            rows.append(
                [
                    n,
                    code(s),
                    num(c["goodput_mbps_total"], 1),
                    ratio_ci(c["capacity_share"], c["capacity_share_ci95"]),
                    num(c["jain"]),
                    f"{num(c['relay_rss_mb'], 0)} / {num(c['proxy_rss_mb'], 0)}",
                    budget,
                ]
            )
    return table(
        [
            "passengers",
            "scheme",
            "total Mbit/s",
            "share of capacity",
            "Jain",
            "RSS relay / proxy (MiB)",
            "budget peak relay / proxy (MiB)",
        ],
        rows,
    )


def sweep(
    src: Sources, rel: str = SWEEP_JSON, schemes: tuple[str, str] = ("minrtt", "hrsch")
) -> str:
    sw = src.load(rel)["budget_sweep"]
    budgets = sorted(sw, key=int)
    largest = budgets[-1]
    n = max(e["n_trips"] for per in sw.values() for e in per.values())
    rows = []
    for mib in budgets:
        row = [f"{mib} MiB"]
        for s in schemes:
            e = sw[mib][s]
            row.append(num(e["backlog_goodput_mbps"], 1))
            ci = e["ci95_vs_largest"]
            row.append(
                "1.00"
                if mib == largest
                else bold(ratio_ci(e["ratio_vs_largest"], ci), resolved(ci, 1.0))
            )
        relay = max(sw[mib][s]["relay_budget_peak_mb"] for s in schemes)
        proxy = max(sw[mib][s]["proxy_budget_peak_mb"] for s in schemes)
        row.append(f"{num(relay, 1)} / {num(proxy, 1)}")
        rows.append(row)
    return table(
        [
            "`--mem-budget`",
            f"`{schemes[0]}` Mbit/s (mean of {n})",
            f"× {largest} MiB [95 % CI]",
            f"`{schemes[1]}` Mbit/s",
            f"× {largest} MiB [95 % CI]",
            "budget peak, relay / proxy (MiB)",
        ],
        rows,
    )


MAHIMAHI_ROWS = (
    ("minrtt", "`minrtt`"),
    ("hrsch", "`hrsch`"),
    ("ecf", "`ecf`"),
    ("minrtt+hol", "`minrtt+hol`"),
    ("kernel-mptcp-conn", "`kernel-mptcp-conn`"),
    ("kernel-mptcp", "`kernel-mptcp`"),
    ("single-path-c0", "`single-path-c0` (T-Mobile)"),
    ("single-path-c1", "`single-path-c1` (Verizon)"),
)
MAHIMAHI_CARRIERS = {"single-path-c0": "T-Mobile", "single-path-c1": "Verizon"}


def mahimahi(src: Sources) -> str:
    ls = src.link_set("mahimahi")
    refs = {r["scheme"] for r in ls["best_single_carrier"]["reference"]}
    ref = MAHIMAHI_CARRIERS[next(iter(refs))] if len(refs) == 1 else "the better carrier"
    rows = []
    for s, label in MAHIMAHI_ROWS:
        o = ls["bulk"][s]["overall"]
        best = ls["best_single_carrier"]["by_scheme"][s]["ratio"]
        bulk = (
            "1.00"
            if s == "minrtt"
            else bold(ratio_ci(o["ratio_vs_minrtt"], o["ci95"]), s == "minrtt+hol")
        )
        rows.append(
            [
                label,
                num(ls["backlog"][s]["goodput_mbps_mean"], 1),
                bold(num(best), s == "minrtt"),
                num(ls["capacity_use"]["by_scheme"][s]["ratio"]),
                bulk,
                num(o["ratio_vs_oracle"]),
            ]
        )
    return table(
        [
            "scheme",
            "backlog Mbit/s",
            f"× {ref} alone",
            "share of capacity",
            "bulk × `minrtt` [95 % CI]",
            "bulk × oracle",
        ],
        rows,
    )


LOST_TIME_ROWS = (
    ("minrtt", "`minrtt`"),
    ("hrsch", "`hrsch`"),
    ("minrtt+ori", "`minrtt+ori`"),
    ("redundant", "`redundant`"),
    ("blest", "`blest`"),
    ("minrtt+hol", "`minrtt+hol`"),
    ("single-path-c1", "best carrier alone (`single-path-c1`)"),
    ("kernel-mptcp-conn", "`kernel-mptcp-conn`"),
)


def lost_time(src: Sources, rows_of: Sequence[tuple[str, str]] = LOST_TIME_ROWS) -> str:
    lt = src.hsr["lost_time"]
    rows = []
    for s, label in rows_of:
        if s not in lt:  # a scheme that did not run in this full run
            continue
        o = lt[s]["overall"]
        rows.append(
            [
                label,
                num(o["actual_s"], 0),
                num(o["oracle_s"], 0),
                num(o["lost_s"], 0),
                pct(o["setup_excess_share"], 0, plus=False),
                pct(o["stall_lit_share"], 0, plus=False),
                pct(o["slow_share"], 0, plus=False),
                num(o["stall_dark_s"], 1),
            ]
        )
    return table(
        [
            "scheme",
            "actual s",
            "oracle s",
            "lost s",
            "set-up",
            "stalled, a carrier lit",
            "rest",
            "stalled, all dark (s)",
        ],
        rows,
    )


HOL_ROWS = (
    ("minrtt+stale", "`stale-filter`"),
    ("minrtt+opp", "`opp-reinject`"),
    ("minrtt+pen", "`penalise`"),
    ("minrtt+hol", "all three"),
    ("hrsch+hol", "all three, on `hrsch`"),
    ("hrsch+stale", "`stale-filter`, on `hrsch`"),
)


def verdict_ci(g: dict[str, Any]) -> Any:
    """The interval a gain's ``resolved`` reads (``verdict_interval``; the pairs' before)."""
    return g[g.get("verdict_interval", "ci95")]


def hol(src: Sources) -> str:
    h = src.hsr["hol_ablation"]

    def cell(g: dict[str, Any]) -> str:
        return bold(pct_ci(g["gain"], verdict_ci(g)), bool(g.get("resolved")))

    rows = [
        [code(s), adds, cell(h[s]["bulk"]), cell(h[s]["backlog"])]
        for s, adds in HOL_ROWS
        if s in h  # a scheme added after the run quoted has no row yet
    ]
    return table(["scheme", "adds to its base", "bulk", "backlogged download"], rows)


SIZE_LABELS = {"256KB": "256 KB", "1MB": "1 MB", "4MB": "4 MB"}


def hrsch_sizes(src: Sources) -> str:
    vs = src.hsr["hrsch_vs_baselines"]["minrtt"]
    rows = []
    for label, e in vs.items():
        name = (
            f"overall (n = {e['n_pairs']})" if label == "overall" else SIZE_LABELS.get(label, label)
        )
        rows.append([name, ratio_ci(e["ratio"], e["ci95"]), num(e["paper"]), words(e["verdict"])])
    return table(["size", "hrsch / minrtt [95 % CI]", "paper", "vs the paper"], rows)


def precision(src: Sources) -> str:
    """results.md: the precision profile's hrsch/minrtt per size with both intervals, and
    its run-to-run variation when the document has it."""
    d = src.load(PRECISION_JSON)
    vs = d["hrsch_vs_baselines"]["minrtt"]
    rows = []
    for label, e in vs.items():
        name = "overall" if label == "overall" else SIZE_LABELS.get(label, label)
        rows.append(
            [
                name,
                f"{num(e['ratio'])}",
                interval(e["ci95"]),
                interval(e.get("ci95_trips")),
                num(e.get("ci95_trips_halfwidth"), 3),
                num(e["paper"]),
                words(e["verdict"]),
            ]
        )
    o = vs["overall"]
    lv = o.get("log_variance") or {}
    out = table(
        [
            "size",
            "hrsch / minrtt",
            "95 % CI, pairs",
            "95 % CI, trips",
            "half-width (trips)",
            "paper",
            "vs the paper",
        ],
        rows,
    )
    out += (
        f"\n\n{o['n_pairs']} pairs on {o.get('n_trips')} trips "
        f"({', '.join(d.get('seeds', [])[:1])} to {', '.join(d.get('seeds', [])[-1:])}); "
        f"commit `{commit_of(d)}`. Variance of the log ratios between trips "
        f"{num(lv.get('between'), 4)}, within a trip {num(lv.get('within'), 4)} "
        f"({num(lv.get('pairs_per_trip'), 1)} pairs per trip): a half-width of 0.05 from the "
        f"trips' interval needs about {lv.get('trips_for_halfwidth', '–')} trips."
    )
    rr = d.get("run_to_run")
    if rr:
        runs = [
            [
                str(i + 1),
                f"`{c[:12]}`" if c else "–",
                num(r, 3),
                interval(ci, 3),
                interval(ct, 3),
            ]
            for i, (c, r, ci, ct) in enumerate(
                zip(
                    rr["commits"],
                    rr["hrsch_vs_minrtt"],
                    rr["ci95"],
                    rr.get("ci95_trips") or [None] * rr["runs"],
                    strict=True,
                )
            )
        ]
        out += "\n\n" + table(
            ["run", "commit", "hrsch / minrtt", "95 % CI, pairs", "95 % CI, trips"], runs
        )
        lo, hi = rr["combined_ci95"]
        out += (
            f"\n\n{rr['runs']} runs of the same configuration: SD between runs "
            f"{num(rr['sd_between_runs'], 3)} (log scale), between-run SD beyond the "
            f"downloads' own error (DerSimonian–Laird τ) {num(rr['tau'], 3)}; combined "
            f"{num(rr['combined'], 3)} [{num(lo, 3)}, {num(hi, 3)}]. One run's interval with "
            f"trips, downloads and run-to-run variation in it: half-width "
            f"**{num(rr.get('single_run_trips_ci95_halfwidth'), 3)}** "
            f"(pairs and run-to-run only: {num(rr['single_run_ci95_halfwidth'], 3)})."
        )
    return out


EVERY_SCHEME = (
    "minrtt",
    "hrsch",
    "blest",
    "ecf",
    "roundrobin",
    "redundant",
    "single-path",
    "kernel-mptcp",
    "kernel-mptcp-conn",
)


def every_scheme(src: Sources) -> str:
    d = src.hsr
    vs = d["hrsch_vs_baselines"]
    n = {d["bulk"][s]["overall"]["n_pairs"] for s in EVERY_SCHEME}
    rows = []
    for s in EVERY_SCHEME:
        o = d["bulk"][s]["overall"]
        h = _get(vs, s, "overall")
        rows.append(
            [
                code(s),
                "1.00" if s == "minrtt" else ratio_ci(o["ratio_vs_minrtt"], o["ci95"]),
                num(o["ratio_vs_oracle"]),
                str(o["n_timeout"]),
                "–" if s == "hrsch" or h is None else ratio_ci(h["ratio"], h["ci95"]),
            ]
        )
    n_text = f", n = {n.pop()}" if len(n) == 1 else ""
    return table(
        [
            "scheme",
            f"bulk × minrtt [95 % CI]{n_text}",
            "× oracle",
            "timeouts",
            "hrsch vs it",
        ],
        rows,
    )


ABLATION_ROWS = (
    ("minrtt+hpr", "handover-failure-aware rejection (HPR)"),
    ("minrtt+tpr", "tail-aware rejection (TPR)"),
    ("minrtt+ori", "redundant injection (ORI)"),
    ("minrtt+er", "extended reinjection (ER)"),
    ("hrsch", "all four"),
)


def ablation(src: Sources) -> str:
    abl = src.hsr["ablation"]
    rows = []
    for s, mechanism in ABLATION_ROWS:
        a = abl[s]
        rows.append(
            [
                mechanism,
                code(s),
                bold(pct_ci(a["gain"], a["ci95"]), resolved(a["ci95"], 0.0)),
                pct(a["paper_gain"]),
                words(a["verdict"]),
            ]
        )
    return table(["mechanism", "scheme", "gain", "paper", "vs the paper"], rows)


def _paper_pct(x: float) -> str:
    """The paper's numbers as it prints them: 47 %, 15 %, 0.3 %."""
    v = x * 100
    return f"{num(v, 0 if v >= 1 else 1)} %"


def reinjection(src: Sources) -> str:
    d = src.hsr
    rows = []
    for k, c in d["reinjection_overhead_vs_paper"].items():
        ci = c["ci95"]
        interval = "" if not ci else f" [{sig2(ci[0])}, {sig2(ci[1])}]"
        rows.append(
            [
                k,
                code(c["scheme"]),
                f"{sig2(c['ours'])} %{interval}",
                _paper_pct(c["paper"]),
                words(c["verdict"]),
            ]
        )
    m = d["extra_traffic"]["minrtt"]
    ci = m.get("reinjected_share_ci95")
    interval = "" if not ci else f" [{sig2(ci[0])}, {sig2(ci[1])}]"
    rows.append(["–", "`minrtt`", f"{sig2(m['reinjected_share'])} %{interval}", "–", ""])
    return table(["k", "scheme", "ours [95 % CI]", "paper", "vs the paper"], rows)


IM_METRICS = (("mean", "mean"), ("p90", "p90"), ("cov", "CoV of per-user means"))


def im(src: Sources) -> str:
    im = src.hsr["im_hrsch"]
    rows = []
    for key, ref in (("vs_single_path", "`single-path`"), ("vs_minrtt", "`minrtt`")):
        for k, label in IM_METRICS:
            c = im["vs_paper"][key][k]
            rows.append(
                [
                    ref,
                    label,
                    pct_ci(c["ours"], c["ci95"]),
                    pct(c["paper"], 0),
                    words(c["verdict"]),
                ]
            )
    return table(["against", "delivery time", "hrsch [95 % CI]", "paper", "vs the paper"], rows)


def im_new_railway(src: Sources, rel: str = IM_JSON) -> str:
    """results.md: the IM changes of hrsch and of the default pipeline on the new railway (the
    precision profile's trips, IM phase only, or a full run's), with the paper's numbers and
    verdicts."""
    d = src.load(rel)
    default = d.get("default_scheme") or UNRECORDED_DEFAULT
    cols = [("hrsch", d.get("im_hrsch")), (default, d.get("im_default"))]
    rows = []
    for key, ref in (("vs_single_path", "`single-path`"), ("vs_minrtt", "`minrtt`")):
        for k, label in IM_METRICS:
            row = [ref, label]
            paper = None
            for _, im in cols:
                c = im["vs_paper"][key][k] if im else None
                row += [pct_ci(c["ours"], c["ci95"]), words(c["verdict"])] if c else ["–", "–"]
                paper = paper if c is None else c["paper"]
            row.insert(2, pct(paper, 0))
            rows.append(row)
    n = max((im or {}).get("n_trips", 0) for _, im in cols)
    out = table(
        [
            "against",
            "delivery time",
            "paper",
            *[h for name, _ in cols for h in (f"`{name}` [95 % CI]", "vs the paper")],
        ],
        rows,
    )
    return out + (
        f"\n\n{n} trips (intervals resample trips); commit `{commit_of(d)}`. Lower is "
        "better: a negative change is faster delivery or a fairer spread."
    )


def recovery(src: Sources) -> str:
    """results.md: the recovery after failed handovers (inline)."""
    h = src.hsr["hof_recovery"]
    n_trips = len(src.hsr["seeds"])
    m, med = h["vs_paper"]["mean"], h["vs_paper"]["median"]
    return (
        f"{h['n_failures']} failed handovers on the {n_trips} trips, {h['n']} windows with a "
        f"download in flight in both ({h['n_bulk']} bulk, {h['n_backlog']} backlog). "
        f"hrsch/minrtt: ratio of means {ratio_ci(m['ours'], m['ci95'])} (paper "
        f"{num(m['paper'], 1)}: {verdict_text(m['verdict'])}), ratio of medians "
        f"{ratio_ci(med['ours'], med['ci95'])} (paper {num(med['paper'], 1)}: "
        f"{verdict_text(med['verdict'])})"
    )


def _relation(ci: Sequence[float | None] | None, ahead: str, behind: str, level: str) -> str:
    if ci and ci[0] is not None and ci[0] > 1:
        return ahead
    if ci and ci[1] is not None and ci[1] < 1:
        return behind
    return level


def hrsch_summary(src: Sources) -> str:
    """results.md, "The answer in short": HRSCH against minrtt and the paper (inline)."""
    d = src.hsr
    vs = d["hrsch_vs_baselines"]["minrtt"]["overall"]
    im = d["im_hrsch"]["vs_paper"]
    h = d["hof_recovery"]["vs_paper"]["mean"]

    def chat(c: dict[str, Any], ref: str) -> str:
        x = c["ours"]
        return f"{abs(x) * 100:.0f} % {'faster' if x < 0 else 'slower'} than {ref}"

    sp, mr = im["vs_single_path"]["mean"], im["vs_minrtt"]["mean"]
    level = _relation(vs["ci95"], "ahead of", "behind", "level with")
    recovers = _relation(h["ci95"], "*better*", "*worse*", "no differently")
    return (
        f"it is {level} `minrtt` in bulk ({_times_ci(vs['ratio'], vs['ci95'])}; paper "
        f"{num(vs['paper'])}×: {verdict_text(vs['verdict'])}), delivers chat "
        f"{chat(mr, '`minrtt`')} and {chat(sp, 'one carrier')} (paper "
        f"{abs(mr['paper']) * 100:.0f} % and {abs(sp['paper']) * 100:.0f} %: "
        f"{verdict_text(mr['verdict'])} and {verdict_text(sp['verdict'])}), and recovers "
        f"{recovers} after failed handovers ({_times_ci(h['ours'], h['ci95'])}, n = {h['n']}; "
        f"paper {num(h['paper'], 1)}×: {verdict_text(h['verdict'])})"
    )


def _times_ci(r: float, ci: Sequence[float | None] | None) -> str:
    """'0.97× [0.90, 1.02]'."""
    s = ratio_ci(r, ci)
    head, _, rest = s.partition(" ")
    return f"{head}× {rest}" if rest else f"{head}×"


# --- the full profile on the new railway -------------------------------------------

#: The goal for the ratio of every scheme's bulk downloads to the trace-optimal oracle.
ORACLE_GOAL = 0.67


def _default(d: dict[str, Any]) -> str:
    return str(d.get("default_scheme") or UNRECORDED_DEFAULT)


def _n_trips(d: dict[str, Any]) -> int:
    return len(d.get("seeds") or [])


def full_sizes(src: Sources) -> str:
    """results.md: hrsch and the default pipeline against minrtt per size, with the paper's
    number and our goal, each with a verdict from the interval."""
    d = src.hsr
    default = _default(d)
    hv = d["hrsch_vs_baselines"]["minrtt"]
    dv = _get(d, "default_vs_baselines", "minrtt") or {}
    rows = []
    for label, h in hv.items():
        name = (
            f"overall (n = {h['n_pairs']})" if label == "overall" else SIZE_LABELS.get(label, label)
        )
        e = dv.get(label)
        rows.append(
            [
                name,
                num(h["paper"]),
                num(h.get("goal")),
                ratio_ci(h["ratio"], h["ci95"]),
                words(h["verdict"]),
                goal_words(h.get("goal_verdict")),
                "–" if e is None else bold(ratio_ci(e["ratio"], e["ci95"])),
                "–" if e is None else words(e["verdict"]),
                "–" if e is None else goal_words(e.get("goal_verdict")),
            ]
        )
    return table(
        [
            "size",
            "paper",
            "goal",
            "`hrsch` / `minrtt` [95 % CI]",
            "vs the paper",
            "vs the goal",
            f"`{default}` / `minrtt` [95 % CI]",
            "vs the paper",
            "vs the goal",
        ],
        rows,
    )


def full_every_scheme(src: Sources) -> str:
    """results.md: every scheme of the latest full run against minrtt, its ratio to the oracle
    per size, and hrsch and the default pipeline against it."""
    d = src.hsr
    default = _default(d)
    hv, dv = d["hrsch_vs_baselines"], d.get("default_vs_baselines") or {}
    labels = list(d["sizes"])
    schemes = sorted(
        (s for s in d["schemes"] if s in d["bulk"]),
        key=lambda s: -(d["bulk"][s]["overall"].get("ratio_vs_minrtt") or 0.0),
    )
    n = {d["bulk"][s]["overall"]["n_pairs"] for s in schemes}
    rows = []
    for s in schemes:
        o = d["bulk"][s]["overall"]
        h, dd = _get(hv, s, "overall"), _get(dv, s, "overall")
        rows.append(
            [
                bold(code(s), s == default),
                "1.00" if s == "minrtt" else ratio_ci(o["ratio_vs_minrtt"], o["ci95"]),
                *[num(_get(d["bulk"][s], lb, "ratio_vs_oracle")) for lb in labels],
                num(o["ratio_vs_oracle"]),
                str(o["n_timeout"]),
                "–" if h is None else ratio_ci(h["ratio"], h["ci95"]),
                "–" if dd is None else ratio_ci(dd["ratio"], dd["ci95"]),
            ]
        )
    n_text = f", n = {n.pop()}" if len(n) == 1 else ""
    return table(
        [
            "scheme",
            f"bulk × `minrtt` [95 % CI]{n_text}",
            *[f"× oracle, {SIZE_LABELS.get(lb, lb)}" for lb in labels],
            "× oracle",
            "timeouts",
            "`hrsch` vs it",
            f"`{default}` vs it",
        ],
        rows,
    )


def full_recovery(src: Sources) -> str:
    """results.md: goodput in the 2 s after each failed handover against minrtt, per scheme
    with an HRSCH mechanism (or the default pipeline), with n and the intervals."""
    d = src.hsr
    h = d["hof_recovery"]
    by = h["by_scheme"]
    rows = []
    for s, e in sorted(by.items(), key=lambda kv: -(kv[1]["ratio_of_means"] or 0.0)):
        if e["n"] == 0:
            continue
        rows.append(
            [
                bold(code(s), s == _default(d)),
                str(e["n"]),
                ratio_ci(e["ratio_of_means"], e["ci95"]),
                ratio_ci(e["ratio_of_medians"], e["ratio_of_medians_ci95"]),
            ]
        )
    m, med = h["vs_paper"]["mean"], h["vs_paper"]["median"]
    return (
        table(
            ["scheme", "windows", "× `minrtt`, mean [95 % CI]", "× `minrtt`, median [95 % CI]"],
            rows,
        )
        + f"\n\n{h['n_failures']} failed handovers on {_n_trips(d)} trips. The paper: "
        f"{num(m['paper'], 1)}× (mean) and {num(med['paper'], 1)}× (median); `hrsch` is "
        f"{verdict_text(m['verdict'])} and {verdict_text(med['verdict'])}."
    )


def full_link_sets(src: Sources) -> str:
    """results.md: the bulk ranking of every scheme on each link set of the latest full run."""
    d = src.hsr
    sets = list(d["link_sets"])
    schemes = [s for s in d["schemes"] if s in d["bulk"]]
    ranks: dict[str, dict[str, int]] = {}
    for name in sets:
        bulk = d["link_sets"][name]["bulk"]
        order = sorted(
            (s for s in schemes if s in bulk),
            key=lambda s: -(bulk[s]["overall"].get("ratio_vs_minrtt") or 0.0),
        )
        ranks[name] = {s: i + 1 for i, s in enumerate(order)}
    rows = []
    for s in sorted(schemes, key=lambda s: ranks[sets[0]].get(s, len(schemes))):
        row = [bold(code(s), s == _default(d))]
        for name in sets:
            o = _get(d["link_sets"][name], "bulk", s, "overall")
            if o is None:
                row.append("–")
                continue
            r = "1.00" if s == "minrtt" else ratio_ci(o["ratio_vs_minrtt"], o["ci95"])
            row.append(f"{r} ({ranks[name][s]})")
        rows.append(row)
    trips = ", ".join(f"{name}: {len(d['link_sets'][name]['seeds'])}" for name in sets)
    return (
        table(["scheme", *[f"{name}: × `minrtt` (rank)" for name in sets]], rows)
        + f"\n\nTrips per link set: {trips}."
    )


FULL_LOST_TIME_ROWS = (
    ("minrtt", "`minrtt`"),
    ("hrsch", "`hrsch`"),
    ("hrsch+stale", "`hrsch+stale`"),
    ("minrtt+ori", "`minrtt+ori`"),
    ("blest", "`blest`"),
    ("redundant", "`redundant`"),
    ("single-path-c0", "carrier 0 alone"),
    ("single-path-c1", "carrier 1 alone"),
    ("kernel-mptcp", "`kernel-mptcp`"),
    ("kernel-mptcp-conn", "`kernel-mptcp-conn`"),
)


@dataclass(frozen=True)
class Region:
    render: Callable[[Sources], str]
    inline: bool = False


def _fleet_load(d: dict[str, Any]) -> str:
    ld = d["load"]
    return (
        f"{d['conns_per_train']} passenger connections per train "
        f"({ld['bulk_conns_per_train']} downloads paced at "
        f"{ld['bulk_rate_bytes_per_s'] // 1024} KiB/s, the rest chat)"
    )


def fuzz_table(src: Sources) -> str:
    """testing.md: executions, coverage and crashes of each fuzz target."""
    d = src.load(FUZZ_JSON)
    rows = [
        [
            code(t),
            f"{r['execs']:,}",
            str(r["seconds"]),
            f"{r['edges']:,}",
            f"{r['guards']:,}",
            f"{r['new_units']:,}",
            bold(str(r["crashes"]), r["crashes"] > 0),
        ]
        for t, r in sorted(d.items())
        if isinstance(r, dict)  # the rest is the run's provenance (commit, clean, ...)
    ]
    return table(["target", "execs", "seconds", "edges", "guards", "new inputs", "crashes"], rows)


def cc_table(src: Sources) -> str:
    """results.md: the subflows' congestion control, CUBIC against BBR (diagnostic CC)."""
    d = src.load(CC_JSON)
    rows = []
    for scheme, e in d["schemes"].items():
        ci = e["ci95_trips"]
        vm = e["vs_minrtt"]
        rows.append(
            [
                code(scheme),
                str(e["pairs"]),
                bold(ratio_ci(e["cubic_over_bbr"], ci), not ci[0] <= 1.0 <= ci[1]),
                f"{num(e['oracle_ratio']['bbr'])} / {num(e['oracle_ratio']['cubic'])}",
                "the reference"
                if scheme == "minrtt"
                else f"{ratio_ci(vm['bbr']['ratio_vs_minrtt'], vm['bbr']['ci95_trips'])} / "
                f"{ratio_ci(vm['cubic']['ratio_vs_minrtt'], vm['cubic']['ci95_trips'])}",
            ]
        )
    return table(
        [
            "scheme",
            "paired downloads",
            "CUBIC / BBR [trips' 95 % CI]",
            "× oracle, BBR / CUBIC",
            "× minrtt within the run, BBR / CUBIC",
        ],
        rows,
    ) + (
        f"\n\n{len(d['trips'])} trips ({d['trips'][0]} to {d['trips'][-1]}); bold: the interval "
        "excludes no change."
    )


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))


def chaos_summary(src: Sources) -> str:
    """testing.md: what the last ``make chaos`` ran and found."""
    d = src.load(CHAOS_JSON)
    by = d["violations_by_invariant"]
    rows = [
        [
            "episodes",
            f"{d['episodes']} of {d['episodes_planned']} (seeds {d['seed']}–"
            f"{d['seed'] + d['episodes_planned'] - 1})",
        ],
        ["duration", f"{d['seconds'] / 60:.0f} min"],
        ["faults", _counts(d["faults"])],
        ["passenger transfers", _counts(d["transfers"])],
        ["chat messages", _counts(d["chat"])],
        ["processes that crashed", str(len(d["crashes"]))],
        ["violations", f"{d['violations']}" + (f" ({_counts(by)})" if by else "")],
    ]
    out = table(["", "`make chaos`"], rows)
    failing = d.get("failing_episodes", [])
    if failing:
        lines = [
            f"- seed {f['seed']}: "
            + "; ".join(f"*{v['invariant']}*: {v['detail']}" for v in f["violations"])
            for f in failing
        ]
        out += "\n\nFailing episodes (`make chaos CHAOS_SEED=<seed> CHAOS_EPISODES=1`):\n\n"
        out += "\n".join(lines)
    return out


def fleet_table(src: Sources) -> str:
    """results.md: the fleet load per fleet size, then the straight-line fit."""
    d = src.load(FLEET_JSON)
    repeated = d.get("repeats", 1) > 1
    rows = [
        [
            f"{r['trains']} ({r.get('repeat', 0) + 1})" if repeated else str(r["trains"]),
            num(r["cpu_per_train_pct"], 2),
            f"{num(r['proxy_rss_mb_p50'], 1)} / {num(r['proxy_rss_mb_p99'], 1)}",
            num(r["proxy_rss_growth_mb_max"], 1),
            num(r["cloud_cpu_pct"], 0),
            f"{num(r['ingest_lag_p50_ms'], 0)} / {num(r['ingest_lag_p99_ms'], 0)}",
            f"{num(r['kafka_records_per_s'], 0)} / {num(r['kafka_bytes_per_s'] / 1000, 1)}",
            num(r["chat_rtt_ms_p99"], 1),
            f"{r['machine_busy_pct']:.0f} % ({num(r['loadavg_1m'][1], 1)})",
            ("pass" if r["ok"] else "**fail**") + (" (saturated)" if r["saturated"] else ""),
        ]
        for r in d["runs"]
    ]
    rows += [
        [str(b["trains"]), f"did not run: {b['error']}", *[""] * 7, "**fail** (saturated)"]
        for b in d.get("did_not_run", [])
    ]
    s = d["sizing"]
    t = table(
        [
            "trains (repeat)" if repeated else "trains",
            "proxy CPU per train (% of a core)",
            "proxy RSS p50 / p99 (MB)",
            "RSS growth, max (MB)",
            "cloud node CPU (% of a core)",
            "ingest lag p50 / p99 (ms)",
            "Kafka records/s / kB/s",
            "chat round trip p99 (ms)",
            "machine busy (load)",
            "checks",
        ],
        rows,
    )
    return (
        f"{t}\n\n"
        f"{_fleet_load(d)}, {d['load']['window_s']:g} s measured per size, on "
        f"{d['environment']['cpus']} cores (binaries of commit "
        f"{d['environment']['binaries_commit']}). "
        f"Straight line through the sizes the machine carried "
        f"({', '.join(str(n) for n in s['fitted_sizes'])} trains"
        + (f", {s['fitted_runs']} runs" if repeated else "")
        + f"): the proxies cost {num(s['proxy_cpu_pct_per_train'], 2)}"
        f"{_ci(s.get('proxy_cpu_pct_per_train_ci95'), 2)} % of a core and "
        f"{num(s['proxy_rss_mb_per_train'], 1)}{_ci(s.get('proxy_rss_mb_per_train_ci95'), 1)} MB "
        f"per train; the cloud node (proxies, Kafka, ingest, PostgreSQL) "
        f"{num(s['cloud_cpu_pct_per_train'], 2)}{_ci(s.get('cloud_cpu_pct_per_train_ci95'), 2)} "
        f"% of a core per train on top of {num(s['cloud_cpu_pct_fixed'], 1)} %"
        + (
            " (brackets: 95 % bootstrap interval over each size's repeats)."
            if s.get("cloud_cpu_pct_per_train_ci95")
            else "."
        )
    )


def _ci(ci: list[float] | None, digits: int) -> str:
    """`` [lo, hi]`` of an interval the JSON has, else nothing."""
    return f" [{num(ci[0], digits)}, {num(ci[1], digits)}]" if ci else ""


def fleet_sizing(src: Sources) -> str:
    """operations.md: how many trains a node holds, measured against the chart's requests."""
    d = src.load(FLEET_JSON)
    s = d["sizing"]
    req = s["chart_proxy_resources"]["requests"]
    rows = [
        [
            f"{n['cores']} cores, {n['gib']} GiB",
            f"{n['trains_by_cpu']}{_ci(n.get('trains_by_cpu_ci95'), 0)}",
            str(n["trains_by_memory"]),
            f"**{n['trains']}**",
            str(n["trains_by_chart_requests"]),
        ]
        for n in s["nodes"]
    ]
    return (
        table(
            [
                "node",
                "trains by CPU (70 %)",
                "trains by memory (70 %)",
                "holds",
                f"the chart's requests ({req['cpu']}, {req['memory']}) schedule",
            ],
            rows,
        )
        + f"\n\nAt {_fleet_load(d)}: {num(s['cloud_cpu_pct_per_train'], 2)} % of a core and "
        f"{num(s['proxy_rss_mb_p99_max'], 1)} MB (proxy p99 RSS) per train, "
        f"{num(s['trains_per_core'], 0)} trains per core and {num(s['trains_per_gib'], 0)} per "
        f"GiB at 70 % (`bench/out/fleet.json`)."
    )


def fleet_headline(src: Sources) -> str:
    """results.md: the largest fleet the machine carried, in one sentence."""
    d = src.load(FLEET_JSON)
    # The top level has the headline numbers: those of the largest size carried (the
    # median over its runs when it was repeated).
    r = d
    not_run = {b["trains"] for b in d.get("did_not_run", [])}
    over = sorted(set(d["saturated_sizes"]) | not_run)
    failed = sorted(set(d["saturated_failed"]) | not_run)
    runs = d.get("headline_runs", 1)
    return (
        f"the largest fleet this 2-core machine carried next to its own load, {r['trains']} "
        f"trains with {_fleet_load(d)}"
        + (f" (median of {runs} runs)" if runs > 1 else "")
        + f", cost the proxies {num(r['cpu_per_train_pct'], 2)} % of a "
        f"core per train, each proxy's RSS stayed at or below {num(r['proxy_rss_mb_p99'], 1)} MB "
        f"(p99), and ingest lag (train clock to LinkDB commit) was "
        f"{num(r['ingest_lag_p99_ms'], 0)} ms at p99, with Kafka taking "
        f"{num(r['kafka_records_per_s'], 0)} records/s; "
        + ("every check passed" if d["ok"] else "**a check failed**")
        + f". Sizes of {', '.join(str(n) for n in over)} trains saturated the machine "
        f"(of those, {', '.join(str(n) for n in failed) or 'none'} failed checks)"
    )


def readme_results(src: Sources) -> str:
    """README: one row per headline question, each with its interval and its section."""
    tr = src.load(TRANSPORT_JSON)
    bsc = tr["best_single_carrier"]["by_scheme"][tr["default_scheme"]]
    ceiling = _get(tr, "capacity_use", "ceiling")
    d = src.load(DEFAULT_JSON)
    dv = d["default_vs_baselines"]["minrtt"]["overall"]
    tb = src.load(TRANSPORT_BULK_JSON)

    def bulk(scheme: str) -> dict[str, Any]:
        o: dict[str, Any] = tb["bulk"][scheme]["overall"]
        return o

    direct = [bulk(s)["ratio_vs_oracle"] for s in ("direct-c0", "direct-c1")]
    lp = src.load(LOOP_JSON)
    w = lp["running"]["cumulative"][-1]

    def rec(k: str) -> str:
        return f"{num(w[k])}× {interval(w[k + '_ci95'])}"

    quic, tls = bulk("quic-hrsch+"), bulk("hrsch+")
    # Two schemes' intervals against the same minrtt: apart or overlapping.
    (ql, qh), (tl, th) = quic["ci95_trips"], tls["ci95_trips"]
    quic_verdict = "yes" if ql > th else "no" if qh < tl else "not resolved"
    rows = [
        [
            "how much more than the better carrier alone do two carriers carry? (one "
            f"backlogged download, default pipeline `{tr['default_scheme']}`)",
            f"{_times_ci(bsc['ratio'], bsc['ci95'])}"
            + f", against a ceiling of {num(ceiling)} on these trips",
            f"[{bsc['n_pairs']} trips](docs/results.md#two-carriers-against-the-better-one)",
        ],
        [
            "does the default pipeline beat MPTCP's `minrtt` scheduler? (bulk downloads)",
            f"{_times_ci(dv['ratio'], dv['ci95_trips'])} (the paper's HRSCH: {num(dv['paper'])}×)",
            f"[{dv['n_trips']} trips]"
            "(docs/results.md#the-default-pipeline-against-minrtt-and-the-paper)",
        ],
        [
            "how much of what the traces allowed do bulk downloads get?",
            f"`hrsch+` {num(tls['ratio_vs_oracle'])} of the trace-optimal oracle (point "
            f"estimate), `minrtt` {num(bulk('minrtt')['ratio_vs_oracle'])}, the passenger's own "
            f"TCP on one carrier {num(min(direct))}–{num(max(direct))}",
            f"[{tls['n_trips']} trips](docs/results.md#bulk-downloads-against-the-oracle)",
        ],
        [
            "after a failed handover, does the table the fleet learned help? (goodput in the "
            "next 2 s, × `minrtt`)",
            f"{rec('hof_recovery_learned')} with the learned table, {rec('hof_recovery_oracle')} "
            f"with the oracle table, {rec('hof_recovery_none')} with none",
            f"[{len(lp['trips'])} trips](docs/results.md#the-closed-fleet-loop)",
        ],
        [
            "do QUIC subflows beat TLS over TCP? (bulk downloads, × `minrtt` over TLS)",
            f"{quic_verdict}: `quic-hrsch+` "
            f"{_times_ci(quic['ratio_vs_minrtt'], quic['ci95_trips'])}, "
            f"`hrsch+` over TLS {_times_ci(tls['ratio_vs_minrtt'], tls['ci95_trips'])}"
            + ("" if quic_verdict == "yes" else "; QUIC stays opt-in"),
            f"[{quic['n_trips']} trips](docs/results.md#quic-subflows-against-tls-over-tcp)",
        ],
    ]
    return table(["question", "answer", "from"], rows)


#: The API's hot queries in the order api.md describes them: (key, label).
API_QUERIES = (
    ("handovers_bbox_page", "a bounding box of handovers, GeoJSON page of 100"),
    ("cell_stats", "per-cell statistics"),
    ("failure_table", "the failure-location table"),
    ("failure_table_304", "the table's conditional poll (304)"),
)


def cloud_side(src: Sources) -> str:
    """results.md: ingest throughput and lag, map matching's cost, the API's latency."""
    ing = src.load(INGEST_JSON)
    lag = ing["lag_phase"]
    rows = [
        [
            f"ingest: {ing['records']:,} records of {ing['trains']:,} trains into LinkDB "
            f"({ing['consumers']} consumers)",
            f"{ing['events_per_s']:,} records/s (goal {ing['goal_events_per_s']:,})",
            f"lag at {lag['achieved_rate_per_s']:,} records/s: p50 {num(ing['lag_p50_ms'], 0)} ms, "
            f"p99 {num(ing['lag_p99_ms'], 0)} ms",
        ]
    ]
    m = src.load(MATCHING_JSON)
    sp = m["speedup"]
    rows.append(
        [
            f"map matching: {m['batch']['fixes']:,} fixes of {m['batch']['trains']} trains "
            "per batch",
            f"{num(m['ms_per_fix_median']['batched'], 2)} ms per fix",
            f"{_times_ci(sp['geomean'], sp['ci95'])} faster than one train at a time",
        ]
    )
    api = src.load(API_JSON)
    if "sizes" not in api:  # a single window per query, from before sizes and repeats
        for key, label in API_QUERIES:
            q = api[key]
            rows.append(
                [
                    f"LinkDB API: {label}",
                    f"p50 {num(q['p50_ms'], 1)} ms, p99 {num(q['p99_ms'], 1)} ms",
                    f"{num(q['rps'], 0)} of {num(q['offered_rps'], 0)} req/s offered, "
                    f"{q['errors']} errors",
                ]
            )
        return table(["what", "result", "and"], rows)
    for size in api["sizes"]:
        for rate, queries in size["rates"].items():
            for key, label in API_QUERIES:
                q = queries.get(key)
                if q is None:
                    continue
                p50, p99 = q["p50_ms_range"], q["p99_ms_range"]
                cpu = q.get("cpu_ms_per_request", {}).get("total")
                # Per request sent: with refusals (cheap) in the count it says nothing.
                cost = f", {num(cpu, 1)} ms CPU a request" if cpu and not q["errors"] else ""
                rows.append(
                    [
                        f"LinkDB API, {size['handovers']:,} handovers, {rate} req/s: {label}",
                        f"p50 {num(q['p50_ms'], 1)} ms [{num(p50[0], 1)}, {num(p50[1], 1)}], "
                        f"p99 {num(q['p99_ms'], 1)} ms [{num(p99[0], 1)}, {num(p99[1], 1)}]",
                        f"{num(q['rps'], 0)} of {num(q['offered_rps'], 0)} req/s offered, "
                        f"{q['errors']} errors{cost}, median [range] of {q['repeats']} runs",
                    ]
                )
    return table(["what", "result", "and"], rows)


#: Every region the docs may hold, by NAME.
def trainer_curve(src: Sources) -> str:
    """docs/trainer.md: the table thresholds' precision against coverage (development routes)."""
    doc = src.load(TRAINER_CURVE_JSON)
    chosen = doc.get("chosen") or {}
    key = (chosen.get("min_failures"), chosen.get("min_failure_rate"))
    # Threshold pairs that select the same cells give the same point: list it once, under the
    # chosen pair if it is one of them, else under the first (smallest) pair.
    by_point: dict[tuple[float | None, float | None], dict[str, Any]] = {}
    for r in doc["curve"]:
        point = (r["precision"], r["coverage"])
        if point not in by_point or (r["min_failures"], r["min_failure_rate"]) == key:
            by_point[point] = r
    rows = []
    for r in sorted(by_point.values(), key=lambda r: -(r["coverage"] or 0.0)):
        is_chosen = (r["min_failures"], r["min_failure_rate"]) == key
        p = r["precision"]
        rows.append(
            [
                bold(f"{r['min_failures']} / {r['min_failure_rate']:.2f}", is_chosen),
                f"{r['tabled_passes']:,}",
                bold(num(None if p is None else 100 * p, 1), is_chosen),
                bold(num(None if r["coverage"] is None else 100 * r["coverage"], 1), is_chosen),
                num(None if not p else 1 / p, 1),
            ]
        )
    return table(
        [
            "min failures / min share",
            "passes through tabled cells",
            "precision (%)",
            "coverage (%)",
            "throttles per failure caught",
        ],
        rows,
    )


def trainer_prior(src: Sources) -> str:
    """docs/trainer.md: the prior rule's sweep of the cost ratio beside the chosen thresholds,
    for each amount of training data (development routes)."""
    doc = src.load(TRAINER_CURVE_JSON)
    chosen = doc.get("chosen") or {}
    key = (chosen.get("min_failures"), chosen.get("min_failure_rate"))
    trains = chosen.get("min_trains", 2)
    rows = []
    for size in sorted(doc["by_training_trips"], key=int):
        run = doc["by_training_trips"][size]
        prior = run.get("prior") or {}
        first = f"{size} (prior a = {prior.get('a', 0):.2f}, b = {prior.get('b', 0):.1f})"
        picked = [
            ("threshold", r)
            for r in run["curve"]
            if (r["min_failures"], r["min_failure_rate"]) == key
        ]
        picked += [
            ("prior", r)
            for r in run["prior_curve"]
            if r["min_trains"] == trains and r["tabled_passes"] > 0
        ]
        for rule, r in picked:
            label = (
                f"threshold {key[0]} / {key[1]:.2f}"
                if rule == "threshold"
                else f"prior, r = {r['failure_cost_ratio']:g} (p > {r['hold_bar']:.2f})"
            )
            p = r["precision"]
            rows.append(
                [
                    first,
                    label,
                    f"{r['tabled_passes']:,}",
                    num(None if p is None else 100 * p, 1),
                    num(None if r["coverage"] is None else 100 * r["coverage"], 1),
                    num(r.get("table_cells"), 1),
                ]
            )
            first = ""
    return table(
        [
            "training trips per route",
            "rule",
            "passes through tabled cells",
            "precision (%)",
            "coverage (%)",
            "cells in the table",
        ],
        rows,
    )


def _cle(d: dict[str, Any]) -> str:
    """'54.4 / 36.3 / 9.3': failures correct / late / early in per cent."""
    return " / ".join(
        num(None if d.get(k) is None else 100 * d[k], 1)
        for k in ("failure_correct", "failure_late", "failure_early")
    )


def _pooled(route: dict[str, Any], part: str, path: Sequence[str]) -> float | None:
    """A fraction pooled over the carriers, weighted by the denominator the
    fraction was taken over (failures, failures with a prediction, successes)."""
    num_, den = 0.0, 0.0
    for label, c in route.items():
        if not label.startswith("c"):
            continue
        v = c[part]
        for k in path[:-1]:
            v = v[k]
        x = v.get(path[-1])
        if x is None:
            continue
        s = c[part]
        if path[-1] == "success_correct":
            w = s["successes"]
        elif path[0] == "with_prediction":
            w = s["failures"] - s["failures_without_prediction"]
        else:
            w = s["failures"]
        num_ += x * w
        den += w
    return num_ / den if den else None


def _predicted(route: dict[str, Any], part: str) -> float | None:
    """The share of the route's failures (both carriers) that had a
    prediction under ``part``, in per cent."""
    cs = [c[part] for label, c in route.items() if label.startswith("c")]
    failures = sum(int(c["failures"]) for c in cs)
    if not failures:
        return None
    without = sum(int(c["failures_without_prediction"]) for c in cs)
    return 100 * (1 - without / failures)


def trainer_heldout(src: Sources) -> str:
    """docs/trainer.md: the validation on the held-out routes, every reading."""
    doc = src.load(TRAINER_TRIPS_JSON)
    routes = doc["routes"]
    names = sorted(routes, key=int)
    paper = doc["paper"]

    def cle(route: dict[str, Any], part: str, pre: tuple[str, ...] = ()) -> str:
        d = {
            k: _pooled(route, part, (*pre, k))
            for k in ("failure_correct", "failure_late", "failure_early")
        }
        return _cle(d)

    def succ(route: dict[str, Any], part: str) -> str:
        x = _pooled(route, part, ("success_correct",))
        return num(None if x is None else 100 * x, 1)

    def by_carrier(route: dict[str, Any], f: Callable[[dict[str, Any]], float | None]) -> str:
        vals = [f(c) for label, c in sorted(route.items()) if label.startswith("c")]
        return " / ".join(num(None if v is None else (100 * v), 1) for v in vals)

    rows = [
        [
            "failures correct / late / early, HPR's lead, with a prediction (%)",
            _cle(paper),
            *[bold(cle(routes[r], "loto_with_lead", ("with_prediction",))) for r in names],
        ],
        [
            "successes correct, HPR's lead (%)",
            num(100 * paper["success_correct"], 1),
            *[bold(succ(routes[r], "loto_with_lead")) for r in names],
        ],
        [
            "the table as deployed: failures correct / late / early, HPR's lead, "
            "with a prediction (%)",
            _cle(paper),
            *[cle(routes[r], "deployed_with_lead", ("with_prediction",)) for r in names],
        ],
        [
            "the table as deployed: failures with a prediction (% of failures)",
            "–",
            *[num(_predicted(routes[r], "deployed_with_lead"), 1) for r in names],
        ],
        [
            "failures correct / late / early, no lead, all failures (%)",
            _cle(paper),
            *[cle(routes[r], "loto") for r in names],
        ],
        [
            "successes correct, no lead (%)",
            num(100 * paper["success_correct"], 1),
            *[succ(routes[r], "loto") for r in names],
        ],
        [
            "failures correct / late / early, t_HO at reconnection, with a prediction (%)",
            _cle(paper),
            *[cle(routes[r], "loto_at_reconnect", ("with_prediction",)) for r in names],
        ],
        [
            "failures without a prediction (% of failures)",
            "–",
            *[
                num(
                    100
                    * sum(
                        c["loto"]["failures_without_prediction"]
                        for k, c in routes[r].items()
                        if k.startswith("c")
                    )
                    / max(
                        1,
                        sum(
                            c["loto"]["failures"] for k, c in routes[r].items() if k.startswith("c")
                        ),
                    ),
                    1,
                )
                for r in names
            ],
        ],
        [
            "failure share: A / B (%)",
            "6.2 / 5.5",
            *[by_carrier(routes[r], lambda c: c["failure_share"]) for r in names],
        ],
        [
            "cells with ≥ 1 failure: A / B (%)",
            "47.3 / 40.4 (≈ 12 passes)",
            *[by_carrier(routes[r], lambda c: c["cells_with_failure"]) for r in names],
        ],
        [
            "separability, location: A / B (%)",
            "72.8 / 71.4",
            *[
                by_carrier(routes[r], lambda c: c["loto"]["separability"]["location"])
                for r in names
            ],
        ],
        [
            "separability, RSRP: A / B (%)",
            "73.5 / 67.1",
            *[by_carrier(routes[r], lambda c: c["loto"]["separability"]["rsrp"]) for r in names],
        ],
        [
            "separability, both: A / B (%)",
            "92.6 / 89.2",
            *[by_carrier(routes[r], lambda c: c["loto"]["separability"]["both"]) for r in names],
        ],
    ]
    return table(["", "paper (PC §3)", *[f"route {r}" for r in names]], rows)


def _share_ci(x: float | None, ci: Sequence[float | None] | None) -> str:
    """'24 % [13, 40]' for a share with its Wilson interval."""
    if x is None:
        return "–"
    if not ci or ci[0] is None or ci[1] is None:
        return f"{num(100 * x, 0)} %"
    return f"{num(100 * x, 0)} % [{num(100 * ci[0], 0)}, {num(100 * ci[1], 0)}]"


#: Trips of the loop's running curve shown in results.md (and the last one).
LOOP_CURVE_TRIPS = (1, 2, 4, 8, 12, 16, 24)


def loop_curve(src: Sources) -> str:
    """results.md: the closed loop's running curve pooled over trips 1..k, at a few k and the
    last trip, and the trip from which the learned table has half of the oracle's recovery
    gain."""
    d = src.load(LOOP_JSON)
    rows_in = d["running"]["cumulative"]
    last = rows_in[-1]["trip"]
    rows = []
    for r in rows_in:
        if r["trip"] not in LOOP_CURVE_TRIPS and r["trip"] != last:
            continue
        g = r.get("hof_recovery_gain") or {}
        rows.append(
            [
                str(r["trip"]),
                str(r["failures"]),
                _share_ci(r["learned_known_failure_share"], r["learned_known_failure_share_ci95"]),
                _share_ci(r["learned_correct_share"], r["learned_correct_share_ci95"]),
                ratio_ci(r["hof_recovery_learned"], r["hof_recovery_learned_ci95"]),
                ratio_ci(r["hof_recovery_none"], r["hof_recovery_none_ci95"]),
                ratio_ci(r["hof_recovery_oracle"], r["hof_recovery_oracle_ci95"]),
                str(r.get("hof_recovery_learned_n", "–")),
                f"{num(g.get('learned'))} / {num(g.get('oracle'))}",
                ratio_ci(g.get("half_oracle_excess"), g.get("half_oracle_excess_ci95")),
            ]
        )
    out = table(
        [
            "trips 1..k",
            "failures",
            "learned table: known",
            "learned table: correct",
            "recovery × minrtt: learned",
            "no table",
            "oracle table",
            "windows",
            "gain over no table: learned / oracle",
            "learned − oracle/2",
        ],
        rows,
    )
    half = _get(d, "half_oracle_gain_trip", "hof_recovery", "cumulative") or {}
    point, lower = half.get("point"), half.get("lower_bound")
    out += (
        f"\n\n{len(d['trips'])} trips ({d.get('description')}; commit `{commit_of(d)}`). "
        f"Half of the oracle's recovery gain, "
        f"pooled over trips 1..k: point estimates from trip "
        f"{point if point is not None else 'never'} on; the interval's lower bound "
        f"{'from trip ' + str(lower) + ' on' if lower is not None else 'on no trip'}."
    )
    return out


#: Events of ``scheduler_events`` the mechanisms table shows, per trip: (key, column).
MECHANISM_EVENTS = (
    ("hof-reject/rejections", "HPR rejections"),
    ("stale-filter/stale_paths", "stale paths"),
    ("tail-reject/deselected", "TPR deselections"),
    ("idle-inject/bursts", "ORI bursts"),
)


def mechanisms(src: Sources, rel: str = MECHANISMS_JSON) -> str:
    """results.md: every scheme of a precision-profile run of several schemes against minrtt
    (trips' interval), each composition against its own base, and what the schedulerlets did
    per trip."""
    d = src.load(rel)
    bulk = d["bulk"]
    labels = [k for k in next(iter(bulk.values())) if k != "overall"]
    ev = d.get("scheduler_events") or {}
    rows = []
    for scheme, per in bulk.items():
        o = per["overall"]
        ci = o.get("ci95_trips") or o.get("ci95")
        row = [code(scheme), bold(ratio_ci(o["ratio_vs_minrtt"], ci), resolved(ci, 1.0))]
        row += [num(per[lb]["ratio_vs_minrtt"]) for lb in labels]
        row.append(num(o.get("ratio_vs_oracle")))
        pt = (ev.get(scheme) or {}).get("per_trip_mean", {})
        row += [num(pt[k], 1) if k in pt else "–" for k, _ in MECHANISM_EVENTS]
        rows.append(row)
    out = table(
        [
            "scheme",
            "× minrtt [trips' 95 % CI]",
            *[f"× minrtt, {SIZE_LABELS.get(lb, lb)}" for lb in labels],
            "× oracle",
            *[f"{c} per trip" for _, c in MECHANISM_EVENTS],
        ],
        rows,
    )
    pairs = []
    for scheme, e in (d.get("hol_ablation") or {}).items():
        g = e["bulk"]
        ci = verdict_ci(g)
        pairs.append(
            [code(scheme), code(e["base"]), e["adds"], bold(pct_ci(g["gain"], ci), resolved(ci, 0))]
        )
    for scheme, e in (d.get("ablation") or {}).items():
        if scheme == "hrsch":
            continue
        o = bulk[scheme]["overall"]
        ci = o.get("ci95_trips") or o.get("ci95")
        gain_ci = None if not ci else [ci[0] - 1, ci[1] - 1]
        gain = None if o["ratio_vs_minrtt"] is None else o["ratio_vs_minrtt"] - 1
        pairs.append(
            [
                code(scheme),
                code("minrtt"),
                e["mechanism"],
                bold(pct_ci(gain, gain_ci), resolved(gain_ci, 0)),
            ]
        )
    if pairs:
        out += "\n\n" + table(
            ["scheme", "base", "adds", "bulk gain over its base [95 % CI]"], pairs
        )
    o = bulk["minrtt"]["overall"]
    out += (
        f"\n\n{o['n_pairs']} downloads per scheme on {o.get('n_trips')} trips "
        f"({', '.join(d.get('seeds', [])[:1])} to {', '.join(d.get('seeds', [])[-1:])}); "
        f"commit `{commit_of(d)}`. Bold: the interval excludes no change; every interval "
        "resamples trips."
    )
    return out


def karn_before_after(src: Sources) -> str:
    """results.md: the mechanisms run before and after the retransmission timer's fix, scheme
    by scheme: ratio to the oracle and to minrtt, and stale paths per trip."""
    before, after = src.load(MECHANISMS_JSON), src.load(KARN_JSON)
    ev_b = before.get("scheduler_events") or {}
    ev_a = after.get("scheduler_events") or {}

    def stale(ev: dict[str, Any], s: str) -> str:
        v = (ev.get(s) or {}).get("per_trip_mean", {}).get("stale-filter/stale_paths")
        return "–" if v is None else num(v, 1)

    def times_minrtt(d: dict[str, Any], s: str) -> str:
        if s == "minrtt":
            return "1.00"
        o = d["bulk"][s]["overall"]
        return ratio_ci(o["ratio_vs_minrtt"], o.get("ci95_trips") or o.get("ci95"))

    rows = []
    for s in after["bulk"]:
        if s not in before["bulk"]:
            continue
        rows.append(
            [
                code(s),
                num(before["bulk"][s]["overall"]["ratio_vs_oracle"]),
                bold(num(after["bulk"][s]["overall"]["ratio_vs_oracle"])),
                times_minrtt(before, s),
                times_minrtt(after, s),
                stale(ev_b, s),
                stale(ev_a, s),
            ]
        )
    return table(
        [
            "scheme",
            "× oracle, before",
            "× oracle, after",
            "× minrtt, before [trips' 95 % CI]",
            "× minrtt, after",
            "stale paths per trip, before",
            "after",
        ],
        rows,
    ) + (
        f"\n\nBefore: commit `{commit_of(before)}`; after: commit `{commit_of(after)}`; "
        f"{len(after.get('seeds', []))} trips each, the same load and trips at once."
    )


def variants_table(src: Sources, rel: str = LEAVE_ONE_OUT_JSON) -> str:
    """results.md: each variant's gain over the composition it differs from (``variants``),
    bulk with the interval its verdict reads."""
    d = src.load(rel)
    rows = []
    for name, e in (d.get("variants") or {}).items():
        g = e["bulk"]
        ci = verdict_ci(g)
        rows.append(
            [
                code(name),
                f"{code(e['scheme'])} over {code(e['base'])}",
                e["measures"],
                bold(pct_ci(g["gain"], ci), bool(g.get("resolved"))),
                str(g.get("n_trips") or "–"),
            ]
        )
    return table(["variant", "gain of", "measures", "bulk gain [95 % CI]", "trips"], rows) + (
        f"\n\nCommit `{commit_of(d)}`; bold: the interval excludes no change (trips' "
        "interval from 10 trips on)."
    )


def recovery_variants(src: Sources) -> str:
    """results.md: the recovery run's variants (other tables, a longer HPR lead) against
    their base, on the recovery windows both have and on the backlogged download."""
    d = src.hsr
    rows = []
    for name, e in (d.get("variants") or {}).items():
        r, b = e.get("recovery"), e["backlog"]
        rows.append(
            [
                code(name),
                f"{code(e['scheme'])} over {code(e['base'])}",
                e["measures"],
                "–" if not r else bold(pct_ci(r["gain"], r["ci95"]), bool(r["resolved"])),
                "–" if not r else str(r["n_windows"]),
                "–"
                if not b.get("n_pairs")
                else bold(pct_ci(b["gain"], b["ci95"]), bool(b.get("resolved"))),
            ]
        )
    return table(
        [
            "variant",
            "gain of",
            "measures",
            "recovery gain [95 % CI]",
            "windows",
            "backlogged download [95 % CI]",
        ],
        rows,
    ) + (
        f"\n\n{_n_trips(d)} trips; commit `{commit_of(d)}`; bold: the interval excludes no "
        "change (recovery: windows resampled; backlogged download: trips resampled)."
    )


_HOLD_VIEWS = {
    "training": "learned, on its 20 training trips",
    "learned": "learned (the trainer's defaults)",
    "broad": "broad (2 failures, 10 %)",
    "early": "learned, each entry at its training failures' 10th percentile",
    "oracle": "oracle (the trip's own failures)",
}


def holds(src: Sources) -> str:
    """results.md: hof-reject's holds replayed per table and E_GPS (``holds --all``)."""
    d = src.load(HOLDS_JSON)
    rows = []
    for view, label in _HOLD_VIEWS.items():
        v = d.get(view)
        if not v:
            continue
        for e, x in v["by_gps_error_m"].items():
            fails = x["failed_handovers"]
            prot = x["failed_handovers_protected_in_time"]
            rows.append(
                [
                    label,
                    str(len(v["trips"])),
                    f"{e} m",
                    f"{prot} of {fails} ({pct(prot / fails if fails else None, 0, plus=False)})",
                    f"{x['holds_before_failure_in_time']} of {x['holds_before_failure']}",
                    num(x["hold_s_per_trip_before_success"], 1),
                ]
            )
    return table(
        [
            "table",
            "trips",
            "E_GPS",
            "failed handovers held in time",
            "holds before a failure: in time",
            "s per trip held before a successful handover",
        ],
        rows,
    )


def default_precision(src: Sources) -> str:
    """results.md: the default pipeline against minrtt and hrsch per size on the precision
    profile's trips, with the trips' interval and the verdicts against the paper and our goal."""
    d = src.load(DEFAULT_JSON)
    default = d["default_scheme"]
    dv = d["default_vs_baselines"]
    rows = []
    for label, e in dv["minrtt"].items():
        h = dv["hrsch"][label]
        rows.append(
            [
                "overall" if label == "overall" else SIZE_LABELS.get(label, label),
                ratio_ci(e["ratio"], e.get("ci95_trips")),
                num(e["paper"]),
                words(e["verdict"]),
                num(e.get("goal")),
                goal_words(e.get("goal_verdict")),
                ratio_ci(h["ratio"], h.get("ci95_trips")),
            ]
        )
    out = table(
        [
            "size",
            f"`{default}` / minrtt [trips' 95 % CI]",
            "paper",
            "vs the paper",
            "goal",
            "vs the goal",
            f"`{default}` / hrsch [trips' 95 % CI]",
        ],
        rows,
    )
    o = dv["minrtt"]["overall"]
    out += (
        f"\n\n{o['n_pairs']} paired downloads on {o.get('n_trips')} trips "
        f"({', '.join(d.get('seeds', [])[:1])} to {', '.join(d.get('seeds', [])[-1:])}); "
        f"commit `{commit_of(d)}`; verdicts from the trips' interval."
    )
    return out


def ab_table(src: Sources, rel: str = WINDOW_AB_JSON) -> str:
    """results.md: two builds on the same trips, each scheme's bulk goodput in build B over
    build A (``polycorn_bench.ab``), overall with the trips' interval and per size, and each
    build's ratio to the oracle."""
    d = src.load(rel)
    if not d.get("comparable"):
        raise DocError(f"{rel}: the two runs are not comparable ({d.get('differ')})")
    (name, ls), *_ = d["link_sets"].items()
    rows = []
    labels: list[str] = []
    for scheme, per in ls["bulk"].items():
        o = per["overall"]
        labels = [k for k in per if k != "overall"]
        ci = o.get("ci95_trips") or o.get("ci95")
        rows.append(
            [
                code(scheme),
                bold(ratio_ci(o["b_over_a"], ci), resolved(ci, 1.0)),
                *[num(per[lb]["b_over_a"]) for lb in labels],
                f"{num(o['a_vs_oracle'])} → {num(o['b_vs_oracle'])}",
                str(o["n_pairs"]),
            ]
        )
    return table(
        [
            "scheme",
            "goodput B / A [trips' 95 % CI]",
            *[SIZE_LABELS.get(lb, lb) for lb in labels],
            "× oracle, A → B",
            "pairs",
        ],
        rows,
    ) + (
        f"\n\nLink set {name}, {len(ls['trips'])} trips; A is commit `{commit_of(d['a'])}`, "
        f"B commit `{commit_of(d['b'])}`; bold: the interval excludes no change."
    )


REGIONS: dict[str, Region] = {
    "hsr-hrsch-summary": Region(on(HSR_V1_JSON, hrsch_summary), inline=True),
    "hsr-aggregation": Region(on(HSR_V1_JSON, aggregation)),
    "hsr-capacity-trips": Region(on(HSR_V1_JSON, capacity_trips)),
    "hsr-capacity-share": Region(on(HSR_V1_JSON, capacity_share)),
    "hsr-concurrency": Region(on(HSR_V1_JSON, concurrency)),
    "sweep-budget": Region(sweep),
    "concurrency-now": Region(
        on(CONCURRENCY_JSON, functools.partial(concurrency, schemes=CONCURRENCY_NOW_SCHEMES))
    ),
    "sweep-now": Region(functools.partial(sweep, rel=SWEEP_NOW_JSON, schemes=("minrtt", "hrsch+"))),
    "hsr-mahimahi": Region(on(HSR_V1_JSON, mahimahi)),
    "hsr-lost-time": Region(on(HSR_V1_JSON, lost_time)),
    "hsr-hol": Region(on(HSR_V1_JSON, hol)),
    "hsr-hrsch-sizes": Region(on(HSR_V1_JSON, hrsch_sizes)),
    "hsr-every-scheme": Region(on(HSR_V1_JSON, every_scheme)),
    "hsr-ablation": Region(on(HSR_V1_JSON, ablation)),
    "hsr-reinjection": Region(on(HSR_V1_JSON, reinjection)),
    "hsr-im": Region(on(HSR_V1_JSON, im)),
    "hsr-precision": Region(precision),
    "hsr-recovery": Region(on(HSR_V1_JSON, recovery), inline=True),
    "trainer-curve": Region(trainer_curve),
    "trainer-prior": Region(trainer_prior),
    "trainer-heldout": Region(trainer_heldout),
    "loop-curve": Region(loop_curve),
    "hsr-mechanisms": Region(mechanisms),
    "hsr-mechanisms-ablation": Region(functools.partial(mechanisms, rel=ABLATION_JSON)),
    "hsr-im-new-railway": Region(im_new_railway),
    "hsr-karn": Region(functools.partial(mechanisms, rel=KARN_JSON)),
    "hsr-karn-before-after": Region(karn_before_after),
    "hsr-leave-one-out": Region(functools.partial(mechanisms, rel=LEAVE_ONE_OUT_JSON)),
    "hsr-leave-one-out-gains": Region(variants_table),
    "hsr-tail": Region(functools.partial(mechanisms, rel=TAIL_JSON)),
    "hsr-tail-gains": Region(functools.partial(variants_table, rel=TAIL_JSON)),
    "hsr-window-ab": Region(ab_table),
    "hsr-recovery-run": Region(on(RECOVERY_JSON, full_recovery)),
    "hsr-recovery-variants": Region(on(RECOVERY_JSON, recovery_variants)),
    "hsr-holds": Region(holds),
    "default-precision": Region(default_precision),
    "default-mechanisms": Region(functools.partial(mechanisms, rel=DEFAULT_JSON)),
    "default-variants": Region(functools.partial(variants_table, rel=DEFAULT_JSON)),
    "hol-default-mechanisms": Region(functools.partial(mechanisms, rel=HOL_DEFAULT_JSON)),
    "hol-default-variants": Region(functools.partial(variants_table, rel=HOL_DEFAULT_JSON)),
    "cc-subflows": Region(cc_table),
    "cc-same-run-mechanisms": Region(functools.partial(mechanisms, rel=CC_SAME_RUN_JSON)),
    "cc-same-run-variants": Region(functools.partial(variants_table, rel=CC_SAME_RUN_JSON)),
    "kernel-mptcp-precision": Region(functools.partial(mechanisms, rel=KERNEL_MPTCP_JSON)),
    "fleet": Region(fleet_table),
    "fleet-sizing": Region(fleet_sizing),
    "fleet-headline": Region(fleet_headline, inline=True),
    "readme-results": Region(readme_results),
    "cloud-side": Region(cloud_side),
    "fuzz": Region(fuzz_table),
    "chaos": Region(chaos_summary),
}

#: Regions of the full run on the current railway (``hsr.json``; the first railway's full
#: run is ``hsr-v1.json``, read by the ``hsr-*`` regions above).
FULL_REGIONS: dict[str, Region] = {
    "full-sizes": Region(full_sizes),
    "full-every-scheme": Region(full_every_scheme),
    "full-ablation": Region(ablation),
    "full-hol": Region(hol),
    "full-reinjection": Region(reinjection),
    "full-im": Region(functools.partial(im_new_railway, rel=HSR_JSON)),
    "full-recovery": Region(full_recovery),
    "full-link-sets": Region(full_link_sets),
    "full-lost-time": Region(functools.partial(lost_time, rows_of=FULL_LOST_TIME_ROWS)),
}

REGIONS.update(FULL_REGIONS)


# --- the files -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stale:
    file: str
    line: int
    name: str


def _check_markers(text: str, where: str) -> None:
    """Every opening marker has its closing one before the next opening marker."""
    pos = 0
    while (m := _OPEN.search(text, pos)) is not None:
        line = text.count("\n", 0, m.start()) + 1
        if m.group(1) not in REGIONS:
            raise DocError(f"{where}:{line}: unknown generated region {m.group(1)!r}")
        end = text.find(_CLOSE, m.end())
        nxt = _OPEN.search(text, m.end())
        if end < 0 or (nxt is not None and nxt.start() < end):
            raise DocError(f"{where}:{line}: region {m.group(1)!r} is not closed")
        pos = end + len(_CLOSE)
    stray = text.count(_CLOSE) - len(_OPEN.findall(text))
    if stray:
        raise DocError(f"{where}: {stray} closing marker(s) without an opening one")


def regenerate(text: str, src: Sources, where: str) -> tuple[str, list[Stale], list[str]]:
    """(the text with every region rewritten, the regions that changed, the names found)."""
    _check_markers(text, where)
    stale: list[Stale] = []
    names: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        names.append(name)
        region = REGIONS[name]
        body = region.render(src)
        body = body if region.inline else "\n" + body + "\n\n"
        if body != m.group("body"):
            stale.append(Stale(where, text.count("\n", 0, m.start()) + 1, name))
        return f"<!-- generated:{name} -->{body}{_CLOSE}"

    return _REGION.sub(sub, text), stale, names


def run(root: Path, check: bool) -> tuple[list[Stale], list[str]]:
    """Regenerate (or, with ``check``, only compare) every file's regions: (stale regions,
    names found)."""
    src = Sources(root)
    all_stale: list[Stale] = []
    all_names: list[str] = []
    for rel in FILES:
        path = root / rel
        text = path.read_text(encoding="utf-8")
        try:
            new, stale, names = regenerate(text, src, rel)
        except (KeyError, TypeError, IndexError) as e:
            raise DocError(f"{rel}: {HSR_JSON} lacks what a region needs: {e!r}") from e
        all_stale += stale
        all_names += names
        if not check and new != text:
            path.write_text(new, encoding="utf-8")
    return all_stale, all_names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="polycorn_bench.docnumbers", description=__doc__.split("\n")[0]
    )
    p.add_argument("--check", action="store_true", help="compare only; exit 1 when stale")
    p.add_argument("--root", type=Path, default=ROOT, help="repository root")
    args = p.parse_args(argv)
    prog = "polycorn_bench.docnumbers"
    try:
        stale, names = run(args.root, args.check)
    except DocError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.check:
        for s in stale:
            print(
                f"{s.file}:{s.line}: generated region {s.name!r} differs from bench/out "
                f"(run: uv run --project bench --locked python -m polycorn_bench.docnumbers)",
                file=sys.stderr,
            )
        return 1 if stale else 0
    print(
        f"{prog}: {len(names)} regions, {len(stale)} rewritten"
        + (": " + ", ".join(s.name for s in stale) if stale else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
