"""What the schedulerlets did: every schedulerlet's event counters
(``polycorn_sched_schedulerlet_events_total{schedulerlet, event}``, crates/core's
``Schedulerlet::counters``) summed over the link set's trips, downlink from the proxy's
end-of-trip snapshot and uplink from the relay's. How often ``hof-reject`` rejected a path,
``stale-filter`` found a stale one or ``tail-reject`` held a tail packet back says whether a
mechanism had anything to do on these trips before its ablation is read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polycorn_bench.metrics import Metrics
from polycorn_bench.records import LinkSetRun

EVENTS = "polycorn_sched_schedulerlet_events_total"

#: Path counters summed over a snapshot's paths: name in hsr.json -> metric.
PATH_COUNTERS = {
    "rto": "polycorn_path_rto_total",
    "stale_transitions": "polycorn_path_stale_transitions_total",
}

METHODS = {
    "path_events": (
        "per scheme: the paths' retransmission timeouts (polycorn_path_rto_total) and "
        "transitions to stale (polycorn_path_stale_transitions_total) summed over paths and "
        "trips, downlink from proxy.metrics and uplink from relay.metrics; per_trip_mean = "
        "downlink total / n_trips; every phase of the trip counted"
    ),
    "scheduler_events": (
        "per scheme: polycorn_sched_schedulerlet_events_total summed over the trips whose "
        "end-of-trip snapshots have it, keyed 'schedulerlet/event', downlink from proxy.metrics "
        "and uplink from relay.metrics; per_trip_mean = downlink total / n_trips; every phase "
        "of the trip counted (bulk, and IM or backlog when they ran)"
    ),
}


def schedulerlet_events(m: Metrics | None) -> dict[str, float] | None:
    """A snapshot's schedulerlet counters keyed 'schedulerlet/event', summed over paths;
    None without the metric."""
    if m is None:
        return None
    series = m.series.get(EVENTS) or m.series.get(EVENTS.removesuffix("_total"))
    if series is None:
        return None
    out: dict[str, float] = {}
    for labels, v in series:
        key = f"{labels.get('schedulerlet', '?')}/{labels.get('event', '?')}"
        out[key] = out.get(key, 0.0) + v
    return out


def _summed(
    ls: LinkSetRun, schemes: list[str], read: Callable[[Metrics | None], dict[str, float] | None]
) -> dict[str, Any] | None:
    """Per scheme that ran: ``read``'s counters of the proxy's (downlink) and the relay's
    (uplink) end-of-trip snapshots summed over the trips where both have them, and the
    downlink's mean per trip; None when no trip had them."""
    out: dict[str, Any] = {}
    for scheme in schemes:
        down: dict[str, float] = {}
        up: dict[str, float] = {}
        n = 0
        for t in ls.trips:
            sr = t.schemes.get(scheme)
            if sr is None:
                continue
            d, u = read(sr.proxy_metrics), read(sr.relay_metrics)
            if d is None or u is None:
                continue
            n += 1
            for k, v in d.items():
                down[k] = down.get(k, 0.0) + v
            for k, v in u.items():
                up[k] = up.get(k, 0.0) + v
        if n:
            out[scheme] = {
                "n_trips": n,
                "downlink": dict(sorted(down.items())),
                "uplink": dict(sorted(up.items())),
                "per_trip_mean": {k: v / n for k, v in sorted(down.items())},
            }
    return out or None


def scheduler_events(ls: LinkSetRun, schemes: list[str]) -> dict[str, Any] | None:
    """Per scheme that ran: the summed counters, or None when no snapshot had them (no
    problem: minrtt, roundrobin and the kernel's schemes have none)."""
    return _summed(ls, schemes, schedulerlet_events)


def _path_counters(m: Metrics | None) -> dict[str, float] | None:
    if m is None:
        return None
    out: dict[str, float] = {}
    for key, metric in PATH_COUNTERS.items():
        series = m.series.get(metric) or m.series.get(metric.removesuffix("_total"))
        if series is not None:
            out[key] = sum(v for _, v in series)
    return out or None


def path_events(ls: LinkSetRun, schemes: list[str]) -> dict[str, Any] | None:
    """Per scheme that ran: the paths' timeouts and stale transitions summed over trips, or
    None when no snapshot had them (the kernel's schemes have one path of their own)."""
    return _summed(ls, schemes, _path_counters)
