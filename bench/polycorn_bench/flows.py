"""Per-download numbers shared by the summaries: :class:`Flow` (duration, censoring, oracle time),
:class:`BacklogRun` (a backlog record with its trip and scheme) and the scheme names every
comparison refers to, and :func:`paired_goodputs`, which pairs either kind with a reference
scheme's records on the same trip and id.

Backlog records are never flows: they stay out of the bulk tables, the per-size ratios, the
oracle comparison and the handover bins."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from polycorn_bench.links import LinkFileError
from polycorn_bench.oracle import Oracle, load_carriers
from polycorn_bench.records import Backlog, Download, Issues, LinkSetRun, Run, TripRun
from polycorn_bench.stats import finite_or_none

#: The reference of every bulk ratio.
REFERENCE = "minrtt"
#: The second reference of the IM ratios (today's operators: one passenger, one SIM).
IM_REFERENCE = "single-path"
OVERALL = "overall"


@dataclass(frozen=True)
class Flow:
    """A download with its derived numbers."""

    trip: str
    scheme: str
    rec: Download
    duration_ms: float | None  # None: no goodput (failed, or timeout without a known timeout)
    censored: bool
    oracle_ms: float | None

    @property
    def pair_key(self) -> tuple[str, int]:
        return (self.trip, self.rec.id)

    @property
    def goodput_mbps(self) -> float | None:
        if self.duration_ms is None:
            return None
        return self.rec.size * 8 / self.duration_ms / 1000

    @property
    def end_ms(self) -> float | None:
        return None if self.duration_ms is None else self.rec.start_ms + self.duration_ms

    @property
    def oracle_ratio(self) -> float | None:
        if self.oracle_ms is None or self.duration_ms is None:
            return None
        return self.oracle_ms / self.duration_ms


def _duration(
    rec: Download, default_timeout_ms: float | None, issues: Issues, where: str
) -> tuple[float | None, bool]:
    """(duration, censored) of a record."""
    if rec.ok and not rec.timeout:
        assert rec.end_ms is not None  # checked when parsed
        end = rec.end_ms
        censored = False
    elif rec.timeout:
        if rec.end_ms is not None:
            end = rec.end_ms
        elif rec.timeout_ms is not None:
            end = rec.start_ms + rec.timeout_ms
        elif default_timeout_ms is not None:
            end = rec.start_ms + default_timeout_ms
        else:
            issues.add("timeout without end_ms or timeout_ms (not censored)", where)
            return None, False
        censored = True
    else:
        return None, False
    dur = end - rec.start_ms
    if dur <= 0:
        issues.add("non-positive download duration", where)
        return None, False
    return dur, censored


def trip_oracle(trip: TripRun, issues: Issues) -> Oracle | None:
    """The oracle of a trip's link files; None (with the reason in ``issues``) when unusable.
    Loaded once per trip: later calls return the same oracle (and report nothing again)."""
    if not trip.oracle_loaded:
        trip.oracle = _load_oracle(trip, issues)
        trip.oracle_loaded = True
    oracle: Oracle | None = trip.oracle
    return oracle


def _load_oracle(trip: TripRun, issues: Issues) -> Oracle | None:
    try:
        carriers = load_carriers(trip.trip_dir)
    except (OSError, LinkFileError) as e:
        issues.add("unusable link files (no oracle)", str(e))
        return None
    if not carriers:
        issues.add("no c0.down in trip directory (no oracle)", str(trip.trip_dir))
        return None
    return Oracle(carriers)


def collect_flows(ls: LinkSetRun, run: Run, with_oracle: bool = True) -> list[Flow]:
    bulk_meta = run.meta.get("bulk")
    t = bulk_meta.get("timeout_ms") if isinstance(bulk_meta, dict) else None
    default_timeout = float(t) if isinstance(t, int | float) else None
    flows: list[Flow] = []
    for trip in ls.trips:
        oracle = trip_oracle(trip, run.issues) if with_oracle else None
        cache: dict[tuple[float, int], float] = {}
        for scheme, sr in trip.schemes.items():
            seen: set[int] = set()
            for rec in sr.downloads:
                where = f"{ls.name}/{trip.name}/{scheme}/bulk.jsonl id {rec.id}"
                if rec.id in seen:
                    run.issues.add("duplicate download id (kept the first)", where)
                    continue
                seen.add(rec.id)
                dur, censored = _duration(rec, default_timeout, run.issues, where)
                o_ms: float | None = None
                if oracle is not None:
                    key = (rec.start_ms, rec.size)
                    if key not in cache:
                        cache[key] = oracle.time_ms(rec.start_ms, rec.size)
                    o_ms = finite_or_none(cache[key])
                flows.append(Flow(trip.name, scheme, rec, dur, censored, o_ms))
    return flows


@dataclass(frozen=True)
class BacklogRun:
    """A ``backlog.jsonl`` record of one scheme on one trip."""

    trip: str
    scheme: str
    rec: Backlog

    @property
    def pair_key(self) -> tuple[str, int]:
        return (self.trip, self.rec.id)

    @property
    def goodput_mbps(self) -> float:
        return self.rec.goodput_mbps


def collect_backlogs(ls: LinkSetRun, issues: Issues) -> list[BacklogRun]:
    """Every backlog record of the link set; a repeated id in one scheme's file keeps the
    first (counted in ``issues``)."""
    out: list[BacklogRun] = []
    for trip in ls.trips:
        for scheme, sr in trip.schemes.items():
            seen: set[int] = set()
            for rec in sr.backlog:
                if rec.id in seen:
                    where = f"{ls.name}/{trip.name}/{scheme}/backlog.jsonl id {rec.id}"
                    issues.add("duplicate backlog id (kept the first)", where)
                    continue
                seen.add(rec.id)
                out.append(BacklogRun(trip.name, scheme, rec))
    return out


class Paired(Protocol):
    """A record that pairs with another scheme's on the same trip and id (:class:`Flow`,
    :class:`BacklogRun`)."""

    @property
    def scheme(self) -> str: ...

    @property
    def pair_key(self) -> tuple[str, int]: ...

    @property
    def goodput_mbps(self) -> float | None: ...


def paired_goodputs(
    records: Iterable[Paired], reference: Iterable[Paired]
) -> list[tuple[float, float]]:
    """(goodput, reference goodput) for each of ``records`` with a goodput whose trip and id
    ``reference`` has with a positive goodput, in the order of ``records``. A key should occur
    once in ``reference`` (``collect_flows`` and ``collect_backlogs`` keep the first)."""
    ref = {r.pair_key: g for r in reference if (g := r.goodput_mbps) is not None}
    out: list[tuple[float, float]] = []
    for rec in records:
        g, r = rec.goodput_mbps, ref.get(rec.pair_key)
        if g is not None and r is not None and r > 0:
            out.append((g, r))
    return out


def paired_ratios_by_trip(
    records: Iterable[Paired], reference: Iterable[Paired]
) -> list[list[float]]:
    """The ratios goodput / reference goodput of :func:`paired_goodputs`, grouped by trip (the
    first element of ``pair_key``), trips in order of first appearance: the clusters of
    :func:`polycorn_bench.stats.trip_geomean_ci`."""
    ref = {r.pair_key: g for r in reference if (g := r.goodput_mbps) is not None}
    groups: dict[str, list[float]] = {}
    for rec in records:
        g, r = rec.goodput_mbps, ref.get(rec.pair_key)
        if g is not None and r is not None and r > 0:
            groups.setdefault(rec.pair_key[0], []).append(g / r)
    return list(groups.values())
