"""From a read :class:`~polycorn_bench.records.Run` to the ``hsr.json`` document.

Conventions (repeated in ``METHODS`` in the output and in ``README.md``):

* goodput_mbps = size · 8 / (end_ms − start_ms) / 1000.
* A timed-out download is *censored*: it counts as completing at its timeout (``end_ms`` of the
  record, else ``start_ms + timeout_ms`` from the record or ``run.json`` ``bulk.timeout_ms``).
  Its real goodput is lower, so this favours the scheme that timed out. Other failures are
  left out of every statistic and counted in ``n_failed``.
* ``ratio_vs_minrtt``: geometric mean over paired downloads (same trip and id, both with a
  goodput value) of goodput_scheme / goodput_minrtt, with a 95 % percentile bootstrap CI
  (10,000 resamples of the pairs, fixed seed). ``ratio_of_means`` = mean goodput of the scheme
  over the pairs / mean goodput of minrtt over the same pairs.
* ``ratio_vs_oracle``: geometric mean over the scheme's downloads of oracle_ms / actual_ms (see
  :mod:`polycorn_bench.oracle`).
* Handover bins: a pair's bin is the number of ``handover_start`` events (any carrier) with
  ``t_ms`` in [start_ms, end_ms] of the *minrtt* download of that pair, so every scheme is
  compared on the same downloads in each bin.
* IM: over delivered messages, pooled over trips: mean and p90 of delay_ms; ``cov`` is the
  coefficient of variation (population std / mean) of the per-user mean delays, computed per
  trip and averaged over trips.
* Backlog (the always-busy download of the backlog phase, ``backlog.jsonl``): goodput over the
  whole window = bytes / (end_ms − start_ms), mean over the records (one per trip); ratio vs
  minrtt = geometric mean over paired records (same trip and id). Backlog records never enter
  the bulk numbers.
* Best single carrier, concurrency (1, 10, 100 passengers), memory-budget sweep and the budget
  check: :mod:`polycorn_bench.capacity`.
* Head-of-line schedulerlets against their base pipeline: :mod:`polycorn_bench.hol`.
* Where bulk downloads lose time against the oracle: :mod:`polycorn_bench.losttime`; what
  each stall waited for, from the endpoints' segment traces: :mod:`polycorn_bench.stalls`.
* HRSCH (hrsch against each baseline, ablation, IM changes, extra traffic, reinjection
  overhead, recovery after failed handovers): :mod:`polycorn_bench.hrsch`.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import numpy as np

from polycorn_bench import capacity, costs, hol, hrsch, losttime, schedevents, stalls, variants
from polycorn_bench.flows import (
    IM_REFERENCE,
    OVERALL,
    REFERENCE,
    BacklogRun,
    Flow,
    collect_backlogs,
    collect_flows,
    paired_goodputs,
    paired_ratios_by_trip,
)
from polycorn_bench.oracle import PAYLOAD_PER_OPPORTUNITY
from polycorn_bench.records import LinkSetRun, Run
from polycorn_bench.stats import (
    bootstrap_geomean_ci,
    ci_halfwidth,
    finite_or_none,
    geomean,
    im_stats,
    safe_ratio,
    trip_interval,
)

__all__ = [
    "HANDOVER_BINS",
    "IM_REFERENCE",
    "METHODS",
    "OVERALL",
    "REFERENCE",
    "Flow",
    "analyse",
    "collect_flows",
]

HANDOVER_BINS = ("0", "1", "2+")
PRIMARY_LINK_SET = "hsr"
#: Sections of the HRSCH issue, per link set and copied to the top level from the primary one.
HRSCH_KEYS = (
    "hrsch_vs_baselines",
    "default_vs_baselines",
    "ablation",
    "im_hrsch",
    "im_default",
    "extra_traffic",
    "reinjection_overhead",
    "reinjection_overhead_vs_paper",
    "hof_recovery",
    "scheduler_events",
    "path_events",
    "variants",
)
#: The aggregation and memory sections, per link set and copied to the top level.
CAPACITY_KEYS = (
    "best_single_carrier",
    "capacity_use",
    "capacity_share",
    "concurrency",
    "budget_sweep",
    "budget_check",
    "hol_ablation",
    "lost_time",
    "stall_causes",
)

METHODS = {
    "goodput": "goodput_mbps = size*8/(end_ms-start_ms)/1000, trip milliseconds",
    "censoring": (
        "a timed-out download counts as completing at its timeout (censored value); its real "
        "goodput is lower, so this favours the scheme that timed out; other failures are "
        "excluded from the statistics and counted in n_failed"
    ),
    "ratio_vs_minrtt": (
        "geometric mean over paired downloads (same trip and id, both with a goodput) of "
        "goodput_scheme/goodput_minrtt; ci95: percentile bootstrap, 10000 resamples of the "
        "pairs, fixed seed; ratio_of_means: mean over the pairs of the scheme's goodput / "
        "mean of minrtt's; ci95_trips: percentile bootstrap that resamples trips instead of "
        "pairs (2000 resamples, fixed seed; each resample pools the drawn trips' ratios), "
        "which carries the between-trip variation (pairs of one trip share its links); null "
        "with fewer than 2 trips"
    ),
    "oracle": (
        "request leaves at start_ms on the carrier that gets it to the cloud first (first "
        "uplink opportunity after start_ms outside blackouts, plus the scheduled one-way "
        "delay); the payload then uses the union of all carriers' downlink opportunities after "
        "that, outside blackouts, 1448 payload bytes each (1500 - 52 IP/TCP header bytes), "
        "each arriving after its carrier's one-way delay (FIFO per carrier); oracle_ms = time "
        "of the last needed arrival - start_ms. No loss, no set-up, no congestion control: a "
        "lower bound. ratio_vs_oracle = geometric mean of oracle_ms/actual_ms"
    ),
    "handover_bins": (
        "handover_start events (any carrier) with t_ms in [start_ms, end_ms] of the minrtt "
        "download of each pair (the same downloads in a bin for every scheme); bins 0, 1, 2+"
    ),
    "backlog": (
        "always-busy download of the backlog phase (backlog.jsonl, back-to-back requests): "
        "goodput_mbps = bytes*8/(end_ms-start_ms)/1000 over the whole window; mean and median "
        "over the records (one per trip); ratio_vs_minrtt = geometric mean over records paired "
        "with minrtt's (same trip and id) of goodput_scheme/goodput_minrtt, ci95 percentile "
        "bootstrap of the pairs (10000 resamples, fixed seed), ratio_of_means; never part of "
        "the bulk numbers"
    ),
    "im": (
        "delivered messages pooled over trips: mean and p90 (linear) of delay_ms; cov = "
        "population std / mean of per-user mean delays, per trip, averaged over trips; "
        "ratios are scheme value / reference value"
    ),
    **capacity.METHODS,
    **hrsch.METHODS,
    **hol.METHODS,
    **losttime.METHODS,
    **stalls.METHODS,
    **schedevents.METHODS,
    **variants.METHODS,
}


def _paired_summary(
    pairs: list[tuple[float, float]], by_trip: list[list[float]], is_ref: bool
) -> dict[str, Any]:
    """``pairs``: (goodput, minrtt's goodput), from :func:`paired_goodputs`; ``by_trip``: the
    same pairs' ratios per trip, from :func:`paired_ratios_by_trip`."""
    if is_ref:
        has = bool(pairs)
        return {
            "n_pairs": len(pairs),
            "ratio_vs_minrtt": 1.0 if has else None,
            "ci95": [1.0, 1.0] if has else None,
            "ci95_halfwidth": 0.0 if has else None,
            "ratio_of_means": 1.0 if has else None,
            "n_trips": len(by_trip),
            "ci95_trips": [1.0, 1.0] if has else None,
            "ci95_trips_halfwidth": 0.0 if has else None,
        }
    ratios = np.asarray([g / r for g, r in pairs])
    lo, hi = bootstrap_geomean_ci(ratios)
    mean_s = float(np.mean([g for g, _ in pairs])) if pairs else math.nan
    mean_r = float(np.mean([r for _, r in pairs])) if pairs else math.nan
    return {
        "n_pairs": len(pairs),
        "ratio_vs_minrtt": finite_or_none(geomean(ratios)),
        "ci95": [finite_or_none(lo), finite_or_none(hi)] if pairs else None,
        "ci95_halfwidth": ci_halfwidth([lo, hi], len(pairs)),
        "ratio_of_means": safe_ratio(mean_s, mean_r),
        **trip_interval(by_trip),
    }


def _group_summary(flows: list[Flow], scheme: str, ref: list[Flow] | None) -> dict[str, Any]:
    good = [f.goodput_mbps for f in flows if f.goodput_mbps is not None]
    oracle = [f.oracle_ratio for f in flows if f.oracle_ratio is not None]
    n_timeout = sum(1 for f in flows if f.rec.timeout)
    n_failed = sum(1 for f in flows if not f.rec.ok and not f.rec.timeout)
    out: dict[str, Any] = {
        "n": len(good),
        "n_records": len(flows),
        "n_ok": sum(1 for f in flows if f.rec.ok and not f.rec.timeout),
        "n_timeout": n_timeout,
        "n_censored": sum(1 for f in flows if f.censored),
        "n_failed": n_failed,
        "goodput_mbps_median": float(np.median(good)) if good else None,
        "goodput_mbps_mean": float(np.mean(good)) if good else None,
    }
    if ref is not None:
        out.update(
            _paired_summary(
                paired_goodputs(flows, ref),
                paired_ratios_by_trip(flows, ref),
                scheme == REFERENCE,
            )
        )
    else:
        out.update(
            {
                "n_pairs": 0,
                "ratio_vs_minrtt": None,
                "ci95": None,
                "ci95_halfwidth": None,
                "ratio_of_means": None,
                "n_trips": 0,
                "ci95_trips": None,
                "ci95_trips_halfwidth": None,
            }
        )
    out["ratio_vs_oracle"] = finite_or_none(geomean(oracle))
    out["n_oracle"] = len(oracle)
    oracle_good = [f.rec.size * 8 / f.oracle_ms / 1000 for f in flows if f.oracle_ms]
    out["oracle_goodput_mbps_median"] = float(np.median(oracle_good)) if oracle_good else None
    return out


def bulk_summary(
    flows: list[Flow], schemes: list[str], labels: list[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    ref = [f for f in flows if f.scheme == REFERENCE] or None
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scheme in schemes:
        mine = [f for f in flows if f.scheme == scheme]
        if not mine:
            continue
        per: dict[str, dict[str, Any]] = {}
        for label in labels:
            group = [f for f in mine if f.rec.label == label]
            if group:
                per[label] = _group_summary(group, scheme, ref)
        per[OVERALL] = _group_summary(mine, scheme, ref)
        out[scheme] = per
    return out


def handover_count(starts: list[float], lo: float, hi: float) -> int:
    return bisect.bisect_right(starts, hi) - bisect.bisect_left(starts, lo)


def handover_bin(count: int) -> str:
    return "0" if count == 0 else "1" if count == 1 else "2+"


def bulk_by_handovers(
    flows: list[Flow], schemes: list[str], ls: LinkSetRun
) -> dict[str, dict[str, dict[str, Any]]] | None:
    """Pairs binned by the handovers during the minrtt download; None without events or
    without minrtt."""
    events = {t.name: t.handover_starts for t in ls.trips if t.handover_starts is not None}
    if not events:
        return None
    ref_by_bin: dict[str, list[Flow]] = {b: [] for b in HANDOVER_BINS}
    for f in flows:
        if f.scheme == REFERENCE and f.trip in events and f.end_ms is not None:
            c = handover_count(events[f.trip], f.rec.start_ms, f.end_ms)
            ref_by_bin[handover_bin(c)].append(f)
    if not any(ref_by_bin.values()):
        return None
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scheme in schemes:
        mine = [f for f in flows if f.scheme == scheme and f.goodput_mbps is not None]
        if not mine:
            continue
        per: dict[str, dict[str, Any]] = {}
        for b in HANDOVER_BINS:
            pairs = paired_goodputs(mine, ref_by_bin[b])
            good = [g for g, _ in pairs]
            entry: dict[str, Any] = {
                "n": len(pairs),
                "goodput_mbps_median": float(np.median(good)) if good else None,
            }
            entry.update(
                _paired_summary(
                    pairs, paired_ratios_by_trip(mine, ref_by_bin[b]), scheme == REFERENCE
                )
            )
            del entry["n_pairs"]
            per[b] = entry
        out[scheme] = per
    return out


BACKLOG_NOTE = (
    "no backlog.jsonl in this link set (no backlog phase, or polycorn-loadgen without the "
    "backlog subcommand)"
)


def backlog_summary(backlogs: list[BacklogRun], schemes: list[str]) -> dict[str, Any] | None:
    """Per scheme with backlog records: goodput over the whole backlog window, and the paired
    ratio to minrtt's (same trip and id). None without any backlog record."""
    if not backlogs:
        return None
    ref = {(b.trip, b.rec.id): b for b in backlogs if b.scheme == REFERENCE}
    out: dict[str, Any] = {}
    for scheme in schemes:
        mine = [b for b in backlogs if b.scheme == scheme]
        if not mine:
            continue
        good = [b.rec.goodput_mbps for b in mine]
        pairs = [(b, ref[(b.trip, b.rec.id)]) for b in mine if (b.trip, b.rec.id) in ref]
        records = []
        for b in mine:
            r = ref.get((b.trip, b.rec.id))
            records.append(
                {
                    "trip": b.trip,
                    "id": b.rec.id,
                    "start_ms": b.rec.start_ms,
                    "end_ms": b.rec.end_ms,
                    "bytes": b.rec.bytes,
                    "requests": b.rec.requests,
                    "completed": b.rec.completed,
                    "failed": b.rec.failed,
                    "goodput_mbps": b.rec.goodput_mbps,
                    "ratio_vs_minrtt": None
                    if r is None
                    else safe_ratio(b.rec.goodput_mbps, r.rec.goodput_mbps),
                }
            )
        entry: dict[str, Any] = {
            "n": len(mine),
            "n_trips": len({b.trip for b in mine}),
            "goodput_mbps_mean": float(np.mean(good)),
            "goodput_mbps_median": float(np.median(good)),
            "bytes": sum(b.rec.bytes for b in mine),
            "requests": sum(b.rec.requests or 0 for b in mine),
            "completed": sum(b.rec.completed or 0 for b in mine),
            "failed": sum(b.rec.failed or 0 for b in mine),
        }
        if scheme == REFERENCE:
            has = bool(pairs)
            entry.update(
                {
                    "n_pairs": len(pairs),
                    "ratio_vs_minrtt": 1.0 if has else None,
                    "ci95": [1.0, 1.0] if has else None,
                    "ratio_of_means": 1.0 if has else None,
                }
            )
        else:
            ratios = np.asarray([b.rec.goodput_mbps / r.rec.goodput_mbps for b, r in pairs])
            lo, hi = bootstrap_geomean_ci(ratios)
            entry.update(
                {
                    "n_pairs": len(pairs),
                    "ratio_vs_minrtt": finite_or_none(geomean(ratios)),
                    "ci95": [finite_or_none(lo), finite_or_none(hi)] if pairs else None,
                    "ratio_of_means": safe_ratio(
                        float(np.mean([b.rec.goodput_mbps for b, _ in pairs])) if pairs else None,
                        float(np.mean([r.rec.goodput_mbps for _, r in pairs])) if pairs else None,
                    ),
                }
            )
        entry["records"] = records
        out[scheme] = entry
    return out


def im_summary(ls: LinkSetRun, schemes: list[str], users: list[int]) -> dict[str, Any]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scheme in schemes:
        per: dict[str, dict[str, Any]] = {}
        for u in users:
            st = _im_users(ls, scheme, u)
            if st is not None:
                per[str(u)] = st
        if per:
            out[scheme] = per
    for per in out.values():
        for users_key, st in per.items():
            for ref_name, key in ((IM_REFERENCE, "vs_single_path"), (REFERENCE, "vs_minrtt")):
                ref = out.get(ref_name, {}).get(users_key)
                st[key] = {
                    k: safe_ratio(st[f], ref[f]) if ref else None
                    for k, f in (("mean", "mean_ms"), ("p90", "p90_ms"), ("cov", "cov"))
                }
    return out


def _im_users(ls: LinkSetRun, scheme: str, u: int) -> dict[str, Any] | None:
    """One scheme's message delay with ``u`` concurrent users, pooled over the trips that
    ran it; None if none did."""
    pooled: dict[tuple[str, int], list[float]] = defaultdict(list)
    covs: list[float] = []
    n_failed = 0
    n_trips = 0
    for trip in ls.trips:
        sr = trip.schemes.get(scheme)
        if sr is None or u not in sr.im:
            continue
        n_trips += 1
        by_user: dict[int, list[float]] = defaultdict(list)
        for m in sr.im[u]:
            if m.ok and m.delay_ms is not None:
                by_user[m.user].append(m.delay_ms)
            else:
                n_failed += 1
        for user, ds in by_user.items():
            pooled[(trip.name, user)] = ds
        _, _, cov, n = im_stats(by_user)
        if n and math.isfinite(cov):
            covs.append(cov)
    if n_trips == 0:
        return None
    mean, p90, _, n_ok = im_stats(pooled)  # type: ignore[arg-type]
    return {
        "n_ok": n_ok,
        "n_failed": n_failed,
        "n_trips": n_trips,
        "mean_ms": finite_or_none(mean),
        "p90_ms": finite_or_none(p90),
        "cov": float(np.mean(covs)) if covs else None,
    }


def size_labels(run: Run) -> list[str]:
    """Size labels in increasing size."""
    return sorted(run.sizes, key=lambda k: (run.sizes[k], k))


def analyse_link_set(ls: LinkSetRun, run: Run) -> dict[str, Any]:
    flows = collect_flows(ls, run)
    backlogs = collect_backlogs(ls, run.issues)
    schemes = run.schemes
    labels = size_labels(run)
    bulk = bulk_summary(flows, schemes, labels)
    im = im_summary(ls, schemes, run.users)
    extra = hrsch.extra_traffic(ls, schemes, run.issues)
    hof, hof_note = hrsch.hof_recovery(flows, ls, schemes, backlogs)
    handover_costs, costs_note = costs.handover_costs(ls, backlogs, schemes)
    backlog = backlog_summary(backlogs, schemes)
    best, best_note = capacity.best_single_carrier(backlogs, schemes)
    if backlog is not None and best is not None:
        for scheme, entry in backlog.items():
            entry["vs_best_single_carrier"] = best["by_scheme"].get(scheme)
    capacity_use = capacity.capacity_use(ls, backlogs, schemes, run.issues)
    share, share_note = capacity.capacity_share(ls, backlogs, schemes, run.issues)
    concurrency = capacity.concurrency_summary(ls, schemes, run.issues)
    sweep = capacity.budget_sweep(ls)
    check, check_note = capacity.budget_check(ls, run.issues)
    notes: dict[str, str] = {}
    if not any(f.scheme == hrsch.HRSCH for f in flows) and not im.get(hrsch.HRSCH):
        notes["hrsch"] = "hrsch did not run: hrsch_vs_baselines and im_hrsch are null"
    if hof_note:
        notes["hof_recovery"] = hof_note
    if costs_note:
        notes["handover_costs"] = costs_note
    if backlog is None:
        notes["backlog"] = BACKLOG_NOTE
    elif best_note:
        notes["best_single_carrier"] = best_note
    if share_note:
        notes["capacity_share"] = share_note
    if concurrency is None:
        notes["concurrency"] = capacity.CONCURRENCY_NOTE
    if sweep is None:
        notes["budget_sweep"] = capacity.SWEEP_NOTE
    if check_note:
        notes["budget"] = check_note
    out: dict[str, Any] = {
        "description": ls.description,
        "trips": [t.name for t in ls.trips],
        "seeds": [t.name for t in ls.trips],
        "bulk": bulk,
        "bulk_by_handovers": bulk_by_handovers(flows, schemes, ls),
        "backlog": backlog,
        "im": im,
        "hrsch_vs_baselines": hrsch.vs_baselines(flows, labels),
        "default_vs_baselines": hrsch.vs_baselines(flows, labels, hrsch.DEFAULT_SCHEME),
        "ablation": hrsch.ablation(bulk),
        "im_hrsch": hrsch.im_changes(im, hrsch.im_trip_intervals(ls, run.users)),
        "im_default": hrsch.im_changes(
            im,
            hrsch.im_trip_intervals(ls, run.users, hrsch.DEFAULT_SCHEME),
            hrsch.DEFAULT_SCHEME,
        ),
        "extra_traffic": extra,
        "reinjection_overhead": hrsch.reinjection_overhead(extra),
        "reinjection_overhead_vs_paper": hrsch.reinjection_vs_paper(extra),
        "hof_recovery": hof,
        "handover_costs": handover_costs,
        "scheduler_events": schedevents.scheduler_events(ls, schemes),
        "path_events": schedevents.path_events(ls, schemes),
        "best_single_carrier": best,
        "capacity_use": capacity_use,
        "capacity_share": share,
        "concurrency": concurrency,
        "budget_sweep": sweep,
        "budget_check": check,
        "hol_ablation": hol.hol_ablation(flows, backlogs, schemes),
        "variants": variants.variants(
            flows, backlogs, schemes, ls, im=im, users=run.users, hof=hof
        ),
        "lost_time": losttime.lost_time(flows, ls, schemes, run.issues),
        "stall_causes": stalls.link_set_stalls(
            run.root / ls.name, [t.name for t in ls.trips], schemes, run.issues
        ),
        "notes": notes,
        "goodput_mbps": {
            scheme: {
                label: sorted(
                    round(g, 4)
                    for f in flows
                    if f.scheme == scheme and f.rec.label == label
                    for g in [f.goodput_mbps]
                    if g is not None
                )
                for label in labels
            }
            for scheme in schemes
            if any(f.scheme == scheme for f in flows)
        },
    }
    return out


def analyse(run: Run) -> dict[str, Any]:
    """The full ``hsr.json`` document."""
    sets = {ls.name: analyse_link_set(ls, run) for ls in run.link_sets}
    primary = PRIMARY_LINK_SET if PRIMARY_LINK_SET in sets else next(iter(sets), None)
    p = sets.get(primary, {}) if primary is not None else {}
    doc: dict[str, Any] = {
        "profile": run.meta.get("profile"),
        "commit": run.meta.get("commit"),
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_dir": str(run.root),
        "link_set": primary,
        "seeds": p.get("seeds", []),
        "schemes": [
            s
            for s in run.schemes
            if any(
                s in d["bulk"]
                or s in d["im"]
                or s in (d["backlog"] or {})
                or any(s in per for per in (d["concurrency"] or {}).values())
                for d in sets.values()
            )
        ],
        "default_scheme": hrsch.DEFAULT_SCHEME,
        "sizes": {k: run.sizes[k] for k in size_labels(run)},
        "users": run.users,
        "bulk": p.get("bulk", {}),
        "im": p.get("im", {}),
        "backlog": p.get("backlog"),
        **{key: p.get(key) for key in HRSCH_KEYS},
        **{key: p.get(key) for key in CAPACITY_KEYS},
        "notes": p.get("notes", {}),
        "paper": hrsch.PAPER,
        "link_sets": sets,
        "methods": {**METHODS, "payload_per_opportunity": PAYLOAD_PER_OPPORTUNITY},
        "issues": run.issues.to_json(),
    }
    result = _json_safe(doc)
    assert isinstance(result, dict)
    return result


def _json_safe(x: Any) -> Any:
    """Replace any NaN/inf left anywhere by ``None`` (strict JSON), numpy scalars by floats."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    if isinstance(x, float | np.floating):
        return finite_or_none(float(x))
    if isinstance(x, np.integer):
        return int(x)
    return x
