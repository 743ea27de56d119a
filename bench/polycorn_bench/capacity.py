"""Aggregation and memory: the backlogged download against the best single carrier,
the concurrency phase (1, 10, 100 passengers), the memory-budget sweep, and the check that no
relay or proxy went past its ``--mem-budget``.

* Best single carrier: per trip, the larger backlog goodput of the ``single-path-c<k>`` schemes
  (each carrier alone, ``pin-path``); every scheme's backlog goodput on that trip divided by it,
  geometric mean over the trips with a 95 % percentile bootstrap CI
  (:func:`polycorn_bench.stats.paired_ratio_stats`). A trip counts only when every carrier
  scheme that ran in the link set has its record there.
* Concurrency: per window of N users (``concurrency-<N>.jsonl``, one always-busy download per
  user, each its own passenger), per scheme and trip: ``goodput_mbps_total`` = the sum of the
  users' goodputs (bytes / their window), Jain's index over the users' goodputs, the relay's and
  proxy's peak RSS in the window (VmHWM, reset at its start), and the share of the carriers'
  capacity over the window it used (as in "capacity use"); over trips: mean goodput and Jain
  index, largest RSS, geometric-mean capacity share with its CI.
* Budget sweep (``sweep/<MiB>/<scheme>/backlog.jsonl``): the backlog goodput per budget and
  scheme, mean over trips, and its paired ratio to the largest budget's on the same trip.
* Capacity use: per backlog record, the trip's carriers' downlink capacity over the record's
  window (from the link files: lit opportunities x 1448 bytes, as the oracle counts them); each
  scheme's goodput / the capacity it may use (its own carrier for ``single-path-c<k>``, the sum
  otherwise), geometric mean over the trips with a 95 % CI; and per trip the aggregation
  ceiling ``sum / largest`` of the carriers' capacities: what a scheme that uses every carrier
  exactly as well as the best carrier alone is used would reach against it.
* Capacity share: per backlog record, what each carrier's downlink delivered over the window
  (the train's interface counters at its start and end, ``backlog.carriers.json``: every byte
  on the wire, headers, retransmissions and copies included) over what it could deliver (its
  lit opportunities there x the emulator's 1500 bytes each), the same for the carriers
  together, and the goodput over all the carriers' capacity; mean over the trips with an
  interval that resamples trips. For every scheme alike, ``direct-c<k>`` included, since the
  counters are the emulator's side of the link, not the relay's.
* Budget check: every metrics snapshot (end of trip, end of each concurrency window, end of each
  sweep run) whose ``polycorn_mem_budget_peak_bytes`` is above its
  ``polycorn_mem_budget_bytes{level="high"}`` (= ``--mem-budget``), or whose high level is not
  the budget the sweep configured, is reported (``budget_check``, ``notes.budget`` and the
  run's ``issues``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from polycorn_bench.flows import BacklogRun, trip_oracle
from polycorn_bench.metrics import BUDGET_LEVELS, BUDGET_PEAK, Metrics
from polycorn_bench.oracle import PAYLOAD_PER_OPPORTUNITY, Carrier
from polycorn_bench.records import CarrierSample, Issues, LinkSetRun, ProcMem
from polycorn_bench.stats import geomean, paired_ratio_stats, trip_mean_interval

#: Each carrier alone (``testbed/pipelines.toml``): single-path-c0, single-path-c1, ...
SINGLE_CARRIER = re.compile(r"^single-path-c(\d+)$")
#: The passengers' own TCP over carrier k, no relay or proxy (topology.sh direct-c<k>), with
#: the end hosts' congestion control as ``~CC``.
DIRECT = re.compile(r"^direct-c(\d+)(?:~[a-z0-9_]+)?$")
#: Schemes confined to one carrier: the tunnel pinned to it over either transport, any
#: ``~CC`` or ``@table`` variant of that, and the direct schemes.
OWN_CARRIER = re.compile(
    r"^(?:(?:quic-)?single-path|direct)-c(\d+)(?:~[a-z0-9_-]+)?(?:@[a-z0-9]+)?$"
)
#: Bytes one trace opportunity carries on the wire (polycorn-emu's --opportunity-bytes
#: default, which topology.sh keeps), headers included.
WIRE_BYTES_PER_OPPORTUNITY = 1500
MIB = 1_048_576


def is_direct(scheme: str) -> bool:
    """A scheme without relay or proxy (no endpoint metrics, memory or traces)."""
    return DIRECT.match(scheme) is not None


def own_carrier(scheme: str) -> int | None:
    """The carrier a single-carrier scheme is confined to; None for the others."""
    m = OWN_CARRIER.match(scheme)
    return int(m.group(1)) if m else None


METHODS = {
    "best_single_carrier": (
        "per trip the largest backlog goodput among single-path-c<k> (every packet on carrier "
        "k, pin-path); each scheme's backlog goodput / that reference, geometric mean over the "
        "trips with a 95 % percentile bootstrap CI (10000 resamples, fixed seed); a trip counts "
        "only if every single-path-c<k> that ran has a record there"
    ),
    "capacity_use": (
        "per backlog record: each carrier's downlink capacity over the record's window = lit "
        "trace opportunities in it x 1448 bytes (blackouts excluded, as in the oracle); "
        "share = goodput / the capacity the scheme may use (its own carrier for "
        "single-path-c<k> and direct-c<k>, the sum of the carriers otherwise), geometric mean "
        "over the trips "
        "with a 95 % percentile bootstrap CI; ceiling per trip = sum / largest carrier "
        "capacity over the union of the trip's backlog windows, geometric mean over trips"
    ),
    "concurrency": (
        "N concurrent passengers (own source addresses), each one always-busy download over "
        "the same window; per trip goodput_mbps_total = sum of the users' bytes*8/window/1000, "
        "jain = (sum x)^2 / (n * sum x^2) over the users' goodputs; relay_rss_mb and "
        "proxy_rss_mb = VmHWM (reset at the window's start via /proc/PID/clear_refs) in MiB; "
        "over trips: mean goodput and jain, max RSS; capacity_share = goodput_mbps_total / the "
        "carriers' capacity over the window (own carrier for single-path-c<k> and direct-c<k>), "
        "geometric mean "
        "over trips with a 95 % bootstrap CI; *_budget_peak_mb: "
        "polycorn_mem_budget_peak_bytes after the window (peak since the process started)"
    ),
    "capacity_share": (
        "per backlog record and carrier k: share = bytes carrier k's downlink delivered between "
        "the train's counter samples at the backlog window's start and end (car<k> RX, all IP "
        "bytes: payload, headers, retransmissions, redundant copies, telemetry) / (lit trace "
        "opportunities of carrier k in that interval x 1500 bytes, the emulator's opportunity); "
        "total = the same summed over the carriers; goodput_share = the record's goodput / "
        "the carriers' summed capacity at 1448 payload bytes per opportunity (as capacity_use "
        "with every carrier usable); each the mean over the records pooled by trip with a 95 % "
        "percentile bootstrap CI that resamples trips (2000 resamples, fixed seed; null with "
        "fewer than 2 trips); carriers null without counter samples"
    ),
    "budget_sweep": (
        "the trip replayed from its start with relay and proxy --mem-budget = MiB, one "
        "always-busy download per scheme and budget side by side; backlog_goodput_mbps = mean "
        "over trips; ratio_vs_largest = geometric mean over trips of goodput / the largest "
        "budget's on the same trip, 95 % bootstrap CI"
    ),
    "budget_check": (
        "every relay and proxy metrics snapshot: polycorn_mem_budget_peak_bytes must not "
        'exceed polycorn_mem_budget_bytes{level="high"} (= --mem-budget), and in the sweep '
        "that level must be the configured budget; violations are listed and counted in issues"
    ),
}


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one user
    has everything. None for no value or when every value is 0 (undefined)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0 or not np.all(np.isfinite(x)) or np.any(x < 0):
        return None
    sq = float(np.sum(x * x))
    if sq == 0:
        return None
    return float(np.sum(x)) ** 2 / (len(x) * sq)


def carrier_schemes(schemes: Sequence[str]) -> list[str]:
    """The single-carrier schemes among ``schemes``, by carrier number."""
    hits = [(int(m.group(1)), s) for s in schemes if (m := SINGLE_CARRIER.match(s))]
    return [s for _, s in sorted(hits)]


BEST_SINGLE_NOTE = (
    "no single-path-c<k> backlog records on a common trip (run the backlog phase with "
    "single-path-c0 and single-path-c1)"
)


def best_single_carrier(
    backlogs: list[BacklogRun], schemes: list[str]
) -> tuple[dict[str, Any] | None, str | None]:
    """(section, note): the per-trip reference and every scheme's paired ratio to it."""
    carriers = carrier_schemes(sorted({b.scheme for b in backlogs}))
    if not carriers:
        return None, BEST_SINGLE_NOTE
    by = {(b.scheme, b.trip, b.rec.id): b for b in backlogs}
    keys = sorted({(b.trip, b.rec.id) for b in backlogs if b.scheme in carriers})
    reference: dict[tuple[str, int], tuple[str, float]] = {}
    for trip, ident in keys:
        recs = [by.get((c, trip, ident)) for c in carriers]
        if any(r is None for r in recs):
            continue
        best = max((r for r in recs if r is not None), key=lambda r: r.rec.goodput_mbps)
        reference[(trip, ident)] = (best.scheme, best.rec.goodput_mbps)
    if not reference:
        return None, BEST_SINGLE_NOTE
    by_scheme: dict[str, Any] = {}
    for scheme in schemes:
        mine = [b for b in backlogs if b.scheme == scheme and (b.trip, b.rec.id) in reference]
        if not mine:
            continue
        a = [b.rec.goodput_mbps for b in mine]
        r = [reference[(b.trip, b.rec.id)][1] for b in mine]
        by_scheme[scheme] = paired_ratio_stats(a, r)
    section = {
        "schemes": carriers,
        "reference": [
            {"trip": trip, "id": ident, "scheme": sch, "goodput_mbps": g}
            for (trip, ident), (sch, g) in sorted(reference.items())
        ],
        "by_scheme": by_scheme,
    }
    return section, None


def carrier_capacity_mbps(carrier: Carrier, start_ms: float, end_ms: float) -> float:
    """Downlink capacity of ``carrier`` over ``[start_ms, end_ms)`` of trip time (Mbit/s): its
    lit trace opportunities there x :data:`PAYLOAD_PER_OPPORTUNITY`."""
    if end_ms <= start_ms:
        raise ValueError(f"empty window [{start_ms}, {end_ms})")
    times, _ = carrier.downlink(end_ms)
    n = int(np.count_nonzero((times >= start_ms) & (times < end_ms)))
    return n * PAYLOAD_PER_OPPORTUNITY * 8 / (end_ms - start_ms) / 1000


def _usable_capacity(
    scheme: str, carriers: list[Carrier] | None, start_ms: float, end_ms: float
) -> float | None:
    """Downlink capacity ``scheme`` may use over the window: its own carrier for
    ``single-path-c<k>`` and ``direct-c<k>``, the sum otherwise; None without link files, a
    window or that carrier."""
    if not carriers or end_ms <= start_ms:
        return None
    k = own_carrier(scheme)
    if k is not None:
        if k >= len(carriers):
            return None
        return carrier_capacity_mbps(carriers[k], start_ms, end_ms)
    return sum(carrier_capacity_mbps(c, start_ms, end_ms) for c in carriers)


def capacity_use(
    ls: LinkSetRun, backlogs: list[BacklogRun], schemes: list[str], issues: Issues
) -> dict[str, Any] | None:
    """How much of the carriers' capacity each scheme's backlogged download used, and the
    per-trip aggregation ceiling; None without backlog records or usable link files."""
    carriers: dict[str, list[Carrier]] = {}
    for trip in ls.trips:
        if any(b.trip == trip.name for b in backlogs):
            oracle = trip_oracle(trip, issues)
            if oracle is not None:
                carriers[trip.name] = oracle.carriers
    mine = [b for b in backlogs if b.trip in carriers]
    if not mine:
        return None
    trips: list[dict[str, Any]] = []
    ceilings: list[float] = []
    for name, cs in carriers.items():
        recs = [b.rec for b in mine if b.trip == name]
        start, end = min(r.start_ms for r in recs), max(r.end_ms for r in recs)
        caps = [carrier_capacity_mbps(c, start, end) for c in cs]
        top = max(caps)
        ceiling = sum(caps) / top if top > 0 else None
        if ceiling is not None:
            ceilings.append(ceiling)
        trips.append({"trip": name, "carriers_mbps": caps, "ceiling": ceiling})
    by_scheme: dict[str, Any] = {}
    for scheme in schemes:
        got: list[float] = []
        usable: list[float] = []
        for b in mine:
            if b.scheme != scheme:
                continue
            cap = _usable_capacity(scheme, carriers[b.trip], b.rec.start_ms, b.rec.end_ms)
            if cap is None:
                issues.add("single-carrier scheme beyond the trip's carriers", f"{b.trip}/{scheme}")
                continue
            if cap > 0:
                got.append(b.rec.goodput_mbps)
                usable.append(cap)
        if got:
            by_scheme[scheme] = paired_ratio_stats(got, usable)
    return {
        "trips": trips,
        "ceiling": geomean(ceilings) if ceilings else None,
        "by_scheme": by_scheme,
    }


def carrier_opportunities(carrier: Carrier, start_ms: float, end_ms: float) -> int:
    """Lit downlink opportunities of ``carrier`` in ``[start_ms, end_ms)`` of trip time."""
    times, _ = carrier.downlink(end_ms)
    return int(np.count_nonzero((times >= start_ms) & (times < end_ms)))


CAPACITY_SHARE_NOTE = (
    "some backlog records have no backlog.carriers.json (the train's carrier counters over the "
    "backlog window): their per-carrier and total shares are null"
)


def capacity_share(
    ls: LinkSetRun, backlogs: list[BacklogRun], schemes: list[str], issues: Issues
) -> tuple[dict[str, Any] | None, str | None]:
    """(``{SCHEME: {"carriers": {k: ...}, "total", "goodput_share", "trips"}}``, note): the
    share of each carrier's downlink capacity each scheme's backlogged download used, per trip
    and over the trips. None without backlog records or link files; the note says when the
    counters were missing."""
    carriers: dict[str, list[Carrier]] = {}
    samples: dict[tuple[str, str], list[CarrierSample]] = {}
    for trip in ls.trips:
        if any(b.trip == trip.name for b in backlogs):
            oracle = trip_oracle(trip, issues)
            if oracle is not None:
                carriers[trip.name] = oracle.carriers
            for scheme, sr in trip.schemes.items():
                samples[(trip.name, scheme)] = sr.backlog_carriers
    out: dict[str, Any] = {}
    missing = False
    for scheme in schemes:
        mine = [b for b in backlogs if b.scheme == scheme and b.trip in carriers]
        if not mine:
            continue
        out[scheme], scheme_missing = _scheme_share(
            ls, scheme, mine, carriers=carriers, samples=samples, issues=issues
        )
        missing = missing or scheme_missing
    if not out:
        return None, None
    return out, CAPACITY_SHARE_NOTE if missing else None


def _scheme_share(
    ls: LinkSetRun,
    scheme: str,
    mine: list[BacklogRun],
    *,
    carriers: dict[str, list[Carrier]],
    samples: dict[tuple[str, str], list[CarrierSample]],
    issues: Issues,
) -> tuple[dict[str, Any], bool]:
    """One scheme's entry of :func:`capacity_share` from its backlog runs, and whether some
    run had no carrier counters."""
    n_carriers = max(len(carriers[b.trip]) for b in mine)
    per_carrier: list[dict[str, list[float]]] = [{} for _ in range(n_carriers)]
    total: dict[str, list[float]] = {}
    goodput: dict[str, list[float]] = {}
    trips: list[dict[str, Any]] = []
    missing = False
    for b in mine:
        cs = carriers[b.trip]
        payload = sum(carrier_capacity_mbps(c, b.rec.start_ms, b.rec.end_ms) for c in cs)
        g_share = b.rec.goodput_mbps / payload if payload > 0 else None
        if g_share is not None:
            goodput.setdefault(b.trip, []).append(g_share)
        entry: dict[str, Any] = {
            "trip": b.trip,
            "id": b.rec.id,
            "goodput_mbps": b.rec.goodput_mbps,
            "capacity_mbps": payload,
            "goodput_share": g_share,
            "window_ms": None,
            "carriers": None,
            "total": None,
        }
        trips.append(entry)
        got = samples.get((b.trip, scheme), [])
        if len(got) < 2 or len(got[0].rx_bytes) != len(cs) or len(got[-1].rx_bytes) != len(cs):
            missing = True
            continue
        first, last = got[0], got[-1]
        if last.t_ms <= first.t_ms:
            issues.add("carrier counters without a window", f"{ls.name}/{b.trip}/{scheme}")
            continue
        rows, entry["total"] = _carrier_rows(cs, first, last)
        entry["window_ms"] = [first.t_ms, last.t_ms]
        entry["carriers"] = rows
        for k, row in enumerate(rows):
            if row["share"] is not None:
                per_carrier[k].setdefault(b.trip, []).append(row["share"])
        if entry["total"] is not None:
            total.setdefault(b.trip, []).append(entry["total"])
    # The queueing the scheme added at each carrier's bottleneck, over the trip.
    queue_p95: dict[str, list[float]] = {}
    for trip in ls.trips:
        mine_run = trip.schemes.get(scheme)
        if mine_run is not None and trip.name in carriers:
            for k, (_, p95) in mine_run.queue_delay_ms.items():
                queue_p95.setdefault(str(k), []).append(p95)
    share = {
        "queue_delay_p95_ms": {
            k: trip_mean_interval([[v] for v in vs]) for k, vs in sorted(queue_p95.items())
        }
        or None,
        "carriers": {
            str(k): trip_mean_interval(list(g.values())) for k, g in enumerate(per_carrier)
        }
        if any(per_carrier)
        else None,
        "total": trip_mean_interval(list(total.values())) if total else None,
        "goodput_share": trip_mean_interval(list(goodput.values())),
        "own_carrier": own_carrier(scheme),
        "trips": trips,
    }
    return share, missing


def _carrier_rows(
    cs: list[Carrier], first: CarrierSample, last: CarrierSample
) -> tuple[list[dict[str, float | None]], float | None]:
    """Each carrier's delivered bytes against its capacity between two samples of the
    train's carrier counters, and the share of the carriers' total capacity delivered."""
    span = last.t_ms - first.t_ms
    rows: list[dict[str, float | None]] = []
    sent_sum = cap_sum = 0.0
    for k, c in enumerate(cs):
        sent = float(last.rx_bytes[k] - first.rx_bytes[k])
        cap = float(carrier_opportunities(c, first.t_ms, last.t_ms) * WIRE_BYTES_PER_OPPORTUNITY)
        rows.append(
            {
                "delivered_mbps": sent * 8 / span / 1000,
                "capacity_mbps": cap * 8 / span / 1000,
                "share": sent / cap if cap > 0 else None,
            }
        )
        sent_sum += sent
        cap_sum += cap
    return rows, sent_sum / cap_sum if cap_sum > 0 else None


def _mib(kb: int | None) -> float | None:
    return None if kb is None else kb / 1024


def _budget_mib(m: Metrics | None) -> tuple[float | None, float | None]:
    """(peak, configured budget) in MiB from a snapshot; None where it lacks them."""
    if m is None:
        return None, None
    peak = m.labelled(BUDGET_PEAK)
    high = m.labelled(BUDGET_LEVELS, level="high")
    return (
        None if peak is None else peak / MIB,
        None if high is None else high / MIB,
    )


def _max_or_none(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


CONCURRENCY_NOTE = "no concurrency-<N>.jsonl in this link set (no concurrency phase)"


def concurrency_summary(
    ls: LinkSetRun, schemes: list[str], issues: Issues | None = None
) -> dict[str, Any] | None:
    """``{N: {SCHEME: {...}}}`` over the trips; None without any concurrency record."""
    counts = sorted(
        {n for t in ls.trips for sr in t.schemes.values() for n in sr.concurrency},
    )
    if not counts:
        return None
    carriers: dict[str, list[Carrier] | None] = {}
    for t in ls.trips:
        if any(sr.concurrency for sr in t.schemes.values()):
            oracle = trip_oracle(t, issues if issues is not None else Issues())
            carriers[t.name] = oracle.carriers if oracle is not None else None
    out: dict[str, Any] = {}
    for n in counts:
        per: dict[str, Any] = {}
        for scheme in schemes:
            trips: list[dict[str, Any]] = []
            for t in ls.trips:
                sr = t.schemes.get(scheme)
                if sr is None or n not in sr.concurrency:
                    continue
                recs = sr.concurrency[n]
                good = [r.goodput_mbps for r in recs]
                mem = sr.concurrency_mem.get(n)
                relay: ProcMem | None = mem.relay if mem else None
                proxy: ProcMem | None = mem.proxy if mem else None
                r_peak, r_budget = _budget_mib(mem.relay_metrics if mem else None)
                p_peak, p_budget = _budget_mib(mem.proxy_metrics if mem else None)
                total = float(np.sum(good)) if good else None
                cap = (
                    _usable_capacity(
                        scheme,
                        carriers.get(t.name),
                        min(r.start_ms for r in recs),
                        max(r.end_ms for r in recs),
                    )
                    if recs
                    else None
                )
                trips.append(
                    {
                        "trip": t.name,
                        "n_users": len(recs),
                        "goodput_mbps_total": total,
                        "capacity_mbps": cap,
                        "capacity_share": total / cap if total is not None and cap else None,
                        "goodput_mbps_user_min": min(good) if good else None,
                        "goodput_mbps_user_max": max(good) if good else None,
                        "jain": jain_index(good),
                        "bytes": sum(r.bytes for r in recs),
                        "failed": sum(r.failed or 0 for r in recs),
                        "relay_rss_mb": _mib(relay.vm_hwm_kb) if relay else None,
                        "proxy_rss_mb": _mib(proxy.vm_hwm_kb) if proxy else None,
                        "relay_budget_peak_mb": r_peak,
                        "proxy_budget_peak_mb": p_peak,
                        "relay_budget_mb": r_budget,
                        "proxy_budget_mb": p_budget,
                    }
                )
            if not trips:
                continue
            totals = [x["goodput_mbps_total"] for x in trips if x["goodput_mbps_total"] is not None]
            jains = [x["jain"] for x in trips if x["jain"] is not None]
            shared = [x for x in trips if x["capacity_share"] is not None]
            share = paired_ratio_stats(
                [x["goodput_mbps_total"] for x in shared], [x["capacity_mbps"] for x in shared]
            )
            per[scheme] = {
                "goodput_mbps_total": float(np.mean(totals)) if totals else None,
                "capacity_share": share["ratio"],
                "capacity_share_ci95": share["ci95"],
                "jain": float(np.mean(jains)) if jains else None,
                "relay_rss_mb": _max_or_none([x["relay_rss_mb"] for x in trips]),
                "proxy_rss_mb": _max_or_none([x["proxy_rss_mb"] for x in trips]),
                "relay_budget_peak_mb": _max_or_none([x["relay_budget_peak_mb"] for x in trips]),
                "proxy_budget_peak_mb": _max_or_none([x["proxy_budget_peak_mb"] for x in trips]),
                "n_users": max(x["n_users"] for x in trips),
                "n_trips": len(trips),
                "trips": trips,
            }
        if per:
            out[str(n)] = per
    return out or None


SWEEP_NOTE = "no sweep/<MiB>/ records in this link set (no budget sweep)"


def budget_sweep(ls: LinkSetRun) -> dict[str, Any] | None:
    """``{MiB: {SCHEME: {"backlog_goodput_mbps", ...}}}``; None without sweep records."""
    budgets = sorted({m for t in ls.trips for m in t.sweep})
    if not budgets:
        return None
    largest = budgets[-1]
    out: dict[str, Any] = {}
    for mib in budgets:
        schemes = sorted({s for t in ls.trips for s in t.sweep.get(mib, {})})
        per: dict[str, Any] = {}
        for scheme in schemes:
            records: list[dict[str, Any]] = []
            pairs_a: list[float] = []
            pairs_b: list[float] = []
            for t in ls.trips:
                sr = t.sweep.get(mib, {}).get(scheme)
                if sr is None or not sr.backlog:
                    continue
                g = float(np.mean([b.goodput_mbps for b in sr.backlog]))
                ref = t.sweep.get(largest, {}).get(scheme)
                g_ref = (
                    float(np.mean([b.goodput_mbps for b in ref.backlog]))
                    if ref and ref.backlog
                    else None
                )
                if g_ref is not None:
                    pairs_a.append(g)
                    pairs_b.append(g_ref)
                r_peak, r_budget = _budget_mib(sr.relay_metrics)
                p_peak, p_budget = _budget_mib(sr.proxy_metrics)
                records.append(
                    {
                        "trip": t.name,
                        "goodput_mbps": g,
                        "relay_budget_peak_mb": r_peak,
                        "proxy_budget_peak_mb": p_peak,
                        "relay_budget_mb": r_budget,
                        "proxy_budget_mb": p_budget,
                    }
                )
            if not records:
                continue
            st = paired_ratio_stats(pairs_a, pairs_b)
            per[scheme] = {
                "backlog_goodput_mbps": float(np.mean([r["goodput_mbps"] for r in records])),
                "n_trips": len(records),
                "ratio_vs_largest": st["ratio"],
                "ci95_vs_largest": st["ci95"],
                "n_pairs_vs_largest": st["n_pairs"],
                "relay_budget_peak_mb": _max_or_none([r["relay_budget_peak_mb"] for r in records]),
                "proxy_budget_peak_mb": _max_or_none([r["proxy_budget_peak_mb"] for r in records]),
                "records": records,
            }
        if per:
            out[str(mib)] = per
    return out or None


def _check_one(
    m: Metrics | None,
    where: dict[str, Any],
    expected_bytes: float | None,
    exceeded: list[dict[str, Any]],
    mismatched: list[dict[str, Any]],
) -> bool | None:
    """Checks one snapshot; True checked, None without the gauges (older binaries)."""
    if m is None:
        return None
    peak = m.labelled(BUDGET_PEAK)
    high = m.labelled(BUDGET_LEVELS, level="high")
    if peak is None or high is None:
        return None
    if peak > high:
        exceeded.append({**where, "peak_bytes": peak, "budget_bytes": high})
    if expected_bytes is not None and not math.isclose(high, expected_bytes):
        mismatched.append({**where, "budget_bytes": high, "configured_bytes": expected_bytes})
    return True


def budget_check(ls: LinkSetRun, issues: Issues) -> tuple[dict[str, Any] | None, str | None]:
    """Every snapshot of the link set against its budget. (section, note); the section is None
    when no snapshot has the budget gauges."""
    exceeded: list[dict[str, Any]] = []
    mismatched: list[dict[str, Any]] = []
    checked = unchecked = 0

    def check(m: Metrics | None, where: dict[str, Any], expected: float | None = None) -> None:
        nonlocal checked, unchecked
        if m is None:
            return
        if _check_one(m, where, expected, exceeded, mismatched):
            checked += 1
        else:
            unchecked += 1

    for t in ls.trips:
        for scheme, sr in t.schemes.items():
            base = {"trip": t.name, "scheme": scheme}
            check(sr.relay_metrics, {**base, "phase": "trip", "endpoint": "relay"})
            check(sr.proxy_metrics, {**base, "phase": "trip", "endpoint": "proxy"})
            for n, mem in sorted(sr.concurrency_mem.items()):
                ph = f"concurrency-{n}"
                check(mem.relay_metrics, {**base, "phase": ph, "endpoint": "relay"})
                check(mem.proxy_metrics, {**base, "phase": ph, "endpoint": "proxy"})
        for mib, per in sorted(t.sweep.items()):
            for scheme, sr in per.items():
                base = {"trip": t.name, "scheme": scheme, "phase": f"sweep-{mib}"}
                check(sr.relay_metrics, {**base, "endpoint": "relay"}, mib * MIB)
                check(sr.proxy_metrics, {**base, "endpoint": "proxy"}, mib * MIB)
    for v in exceeded:
        issues.add(
            "memory budget exceeded",
            f"{ls.name}/{v['trip']}/{v['scheme']} {v['phase']} {v['endpoint']}: peak "
            f"{v['peak_bytes']:.0f} B > --mem-budget {v['budget_bytes']:.0f} B",
        )
    for v in mismatched:
        issues.add(
            "memory budget not as configured",
            f"{ls.name}/{v['trip']}/{v['scheme']} {v['phase']} {v['endpoint']}: budget "
            f"{v['budget_bytes']:.0f} B, configured {v['configured_bytes']:.0f} B",
        )
    if checked == 0:
        note = "no metrics snapshot has the memory-budget gauges" if unchecked else None
        return None, note
    schemes_over = sorted({v["scheme"] for v in exceeded})
    section = {
        "ok": not exceeded and not mismatched,
        "n_checked": checked,
        "n_unchecked": unchecked,
        "schemes_exceeding": schemes_over,
        "exceeded": exceeded,
        "mismatched": mismatched,
    }
    note = None
    if exceeded:
        note = (
            f"memory budget exceeded in {len(exceeded)} snapshot(s), schemes "
            f"{', '.join(schemes_over)} (budget_check.exceeded)"
        )
    elif mismatched:
        note = f"{len(mismatched)} snapshot(s) ran with another budget than configured"
    return section, note


__all__ = [
    "METHODS",
    "best_single_carrier",
    "budget_check",
    "budget_sweep",
    "capacity_share",
    "carrier_schemes",
    "concurrency_summary",
    "is_direct",
    "jain_index",
    "own_carrier",
]
