"""Where stalls of bulk downloads come from, from the endpoints' segment traces.

With ``SEGMENT_TRACE=1`` (polycorn_benchrun.hsr) the relay and the proxy of every scheme write
a segment trace (``--trace-dir``, crates/core/src/trace.rs): every DATA frame the proxy wrote
to a path (``sent``: first copy, redundant copy or reinjection), every DATA frame the relay
received (``recv``: path, offset, new bytes), timeouts, stale paths, segments given back for
reinjection (``requeue``, with its cause) and head-of-line recovery (``head``).

For each stall of a download (a run of at least :data:`losttime.STALL_MIN_MS` without a new
byte at the passenger, as in :mod:`polycorn_bench.losttime`), this module finds the segment
the passenger waited for (the relay's in-order point at the stall's start) and follows it:

* **stranded**: its first copy went to a path that did not deliver it in time, and a copy sent
  again (on another path, or the same one after its subflow came back) ended the stall. The
  stall splits into the wait until the sender sent it again (``wait_resend``: noticing the
  path was stale, an RTO, a lost subflow, head-of-line recovery, or a redundant copy placed
  beside the first; by ``cause``) and the new
  copy's trip (``resend_transit``);
* **slow**: the first copy arrived on its own path, late (a blackout or a deep queue on that
  path, with nothing sent again, or sent again too late to matter);
* **not sent**: the segment left the proxy only after the stall began: the sender had no
  room (every path's window full, the peer's window) or nothing to send (the origin);
* **unmatched**: no trace record explains it (trace missing, dropped records, a stall
  before the first byte).

The result is per scheme: stalled time by kind, the split of ``stranded`` time, and the
stalls themselves for inspection. Times in the output are milliseconds.

Beside the stalls, each carrier's **use** during the downloads (:func:`path_use`): the bytes it
delivered over its downlink capacity (the oracle's opportunities), and the share of the
proxy's 100 ms samples of the path in each state (room in the window, full, stale, timeout):
a carrier that delivers a fraction of its capacity while its window has room was held back
upstream of the scheduler (the connection's window, the origin), one that is full is held by
its own window or queue.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from polycorn_bench import provenance
from polycorn_bench.losttime import STALL_MIN_MS
from polycorn_bench.oracle import Carrier, load_carriers
from polycorn_bench.records import Download, Issues, read_downloads, read_jsonl

KINDS = ("stranded", "slow", "not_sent", "unmatched")


@dataclass
class Sent:
    t: float
    path: int
    copy: str


@dataclass
class ConnRecv:
    """The relay's view of one connection: arrivals and the in-order point over time."""

    # (t, path, off, len, new) in time order
    events: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    # in-order point after each change: parallel lists of times and offsets
    t_contig: list[float] = field(default_factory=list)
    contig: list[int] = field(default_factory=list)

    def build(self) -> None:
        self.events.sort()
        have: list[tuple[int, int]] = []  # disjoint received ranges, sorted
        end = 0
        for t, _, off, ln, _new in self.events:
            bisect.insort(have, (off, off + ln))
            merged: list[tuple[int, int]] = []
            for a, b in have:
                if merged and a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            have = merged
            new_end = have[0][1] if have and have[0][0] <= 0 else 0
            if new_end > end:
                end = new_end
                self.t_contig.append(t)
                self.contig.append(end)

    def contig_at(self, t: float) -> int:
        i = bisect.bisect_right(self.t_contig, t)
        return self.contig[i - 1] if i else 0

    def passes(self, off: int) -> tuple[float, int] | None:
        """(time, path) at which the in-order point first went beyond ``off``."""
        i = bisect.bisect_right(self.contig, off)
        if i >= len(self.contig):
            return None
        t = self.t_contig[i]
        path = next((p for tt, p, o, ln, new in self.events if tt == t and o <= off < o + ln), None)
        if path is None:
            path = next((p for tt, p, o, ln, _ in self.events if tt <= t and o <= off < o + ln), -1)
        return t, path

    def bytes_between(self, t0: float, t1: float) -> int:
        return sum(new for t, _, _, _, new in self.events if t0 <= t < t1)


@dataclass
class PathSample:
    """The proxy's view of one path at one instant (``path`` lines of the trace)."""

    t: float
    avail: str
    stale: bool
    rto_count: int
    in_flight: int
    cwnd: int


@dataclass
class Trace:
    """Both ends' traces of one scheme on one trip, times in trip milliseconds."""

    recv: dict[int, ConnRecv]
    # (conn, segment offset) -> sends in time order
    sends: dict[tuple[int, int], list[Sent]]
    # conn -> sorted segment offsets, to find the segment holding a byte
    seg_offsets: dict[int, list[int]]
    seg_len: dict[tuple[int, int], int]
    # (conn, segment offset) -> (t, cause, path) of requeues and head reinjections
    requeues: dict[tuple[int, int], list[tuple[float, str, int]]]
    dropped: int
    # path -> the proxy's samples of it, in time order
    samples: dict[int, list[PathSample]] = field(default_factory=dict)
    # conn -> (time, path) the relay first wrote the request's first byte (offset 0)
    request_sent: dict[int, tuple[float, int]] = field(default_factory=dict)
    # conn -> (time, path) the proxy first received it
    request_arrived: dict[int, tuple[float, int]] = field(default_factory=dict)
    # (conn, max_data) -> (time, path) of the relay's WINDOW frame, and of its first arrival
    window_sent: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    window_arrived: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    # conn -> (time, limited) transitions of "new data waits only for the peer's window"
    window_limited: dict[int, list[tuple[float, bool]]] = field(default_factory=dict)

    def window_limited_ms(self, conn: int, t0: float, t1: float) -> float:
        """Time within [t0, t1] that ``conn``'s new data waited only for the peer's window."""
        total, since = 0.0, None
        for t, on in self.window_limited.get(conn, []):
            if on and since is None:
                since = t
            elif not on and since is not None:
                total += max(0.0, min(t, t1) - max(since, t0))
                since = None
        if since is not None:
            total += max(0.0, t1 - max(since, t0))
        return total

    def segment_of(self, conn: int, off: int) -> int | None:
        offs = self.seg_offsets.get(conn)
        if not offs:
            return None
        i = bisect.bisect_right(offs, off) - 1
        if i < 0:
            return None
        s = offs[i]
        return s if off < s + self.seg_len[(conn, s)] else None


def read_trace(trace_dir: Path, epoch_ms: float, issues: Issues) -> Trace | None:
    """The relay's and the proxy's trace files of one scheme (every session's file), or None
    when the directory has no trace."""
    files = sorted(trace_dir.glob("*.jsonl")) if trace_dir.is_dir() else []
    if not files:
        return None
    reader = _TraceReader()
    sessions: dict[str, int] = {}
    for f in files:
        # relay-<session>-<start>.jsonl / proxy-<session>-<start>.jsonl: connection ids
        # restart at 1 in every session, so they are told apart by session.
        parts = f.stem.split("-")
        sid = sessions.setdefault(parts[1] if len(parts) > 1 else f.stem, len(sessions))
        reader.read_file(f, sid, epoch_ms, issues)
    return reader.trace()


@dataclass
class _TraceReader:
    """A scheme's trace as its files are read: :class:`Trace`'s fields, unsorted."""

    recv: dict[int, ConnRecv] = field(default_factory=lambda: defaultdict(ConnRecv))
    sends: dict[tuple[int, int], list[Sent]] = field(default_factory=lambda: defaultdict(list))
    seg_len: dict[tuple[int, int], int] = field(default_factory=dict)
    requeues: dict[tuple[int, int], list[tuple[float, str, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    samples: dict[int, list[PathSample]] = field(default_factory=lambda: defaultdict(list))
    request_sent: dict[int, tuple[float, int]] = field(default_factory=dict)
    request_arrived: dict[int, tuple[float, int]] = field(default_factory=dict)
    window_sent: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    window_arrived: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    window_limited: dict[int, list[tuple[float, bool]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    dropped: int = 0

    def read_file(self, f: Path, sid: int, epoch_ms: float, issues: Issues) -> None:
        """One endpoint's trace file of session ``sid``."""
        relay = f.name.startswith("relay-")
        file_dropped, ended = 0, False
        for obj in read_jsonl(f, issues):
            ev = obj.get("ev")
            if ev in ("end", "dropped"):
                d = obj.get("dropped" if ev == "end" else "total")
                file_dropped = max(file_dropped, d if isinstance(d, int) else 0)
                ended = ended or ev == "end"
                continue
            t = obj.get("t_ms")
            if not isinstance(t, int | float):
                issues.add("bad trace record", f"{f}: no t_ms")
                continue
            try:
                self.record(ev, obj, relay, sid, float(t) - epoch_ms)
            except (KeyError, TypeError, ValueError):
                issues.add("bad trace record", f"{f}: {ev} with missing fields")
        self.dropped += file_dropped
        if not ended:
            issues.add("trace without its end line (process killed?)", str(f))

    def record(self, ev: Any, obj: dict[str, Any], relay: bool, sid: int, t: float) -> None:
        """One trace record, at trip time ``t``; KeyError, TypeError or ValueError when a
        field it needs is missing or malformed."""
        if ev == "recv" and relay:
            self.recv[_cid(sid, obj)].events.append(
                (t, int(obj["path"]), int(obj["off"]), int(obj["len"]), int(obj["new"]))
            )
        elif ev in ("sent", "recv") and int(obj["off"]) == 0:
            # The request's first byte: sent by the relay, received by the proxy.
            side = self.request_sent if relay else self.request_arrived
            conn_id = _cid(sid, obj)
            if (ev == "sent") == relay and (conn_id not in side or t < side[conn_id][0]):
                side[conn_id] = (t, int(obj["path"]))
            if ev == "sent" and not relay:
                self.sent((conn_id, 0), obj, t)
        elif ev == "sent" and not relay:
            self.sent((_cid(sid, obj), int(obj["off"])), obj, t)
        elif ev in ("window_sent", "window_recv"):
            key = (_cid(sid, obj), int(obj["max_data"]))
            w = self.window_sent if ev == "window_sent" else self.window_arrived
            if (ev == "window_sent") == relay and key not in w:
                w[key] = (t, int(obj["path"]))
        elif not relay:
            self.proxy_state(ev, obj, sid, t)

    def sent(self, key: tuple[int, int], obj: dict[str, Any], t: float) -> None:
        """A DATA frame the proxy wrote: segment ``key`` (conn, offset)."""
        self.sends[key].append(Sent(t, int(obj["path"]), str(obj["copy"])))
        self.seg_len[key] = int(obj["len"])

    def proxy_state(self, ev: Any, obj: dict[str, Any], sid: int, t: float) -> None:
        """The proxy's window-limited transitions, requeues, path samples and head
        reinjections."""
        if ev == "window_limited":
            self.window_limited[_cid(sid, obj)].append((t, bool(obj["limited"])))
        elif ev == "requeue":
            key = (_cid(sid, obj), int(obj["off"]))
            self.requeues[key].append((t, str(obj["cause"]), int(obj["path"])))
        elif ev == "path":
            self.samples[int(obj["path"])].append(
                PathSample(
                    t,
                    str(obj["avail"]),
                    bool(obj["stale"]),
                    int(obj["rto_count"]),
                    int(obj["in_flight"]),
                    int(obj["cwnd"]),
                )
            )
        elif ev == "head" and obj.get("reinject"):
            key = (_cid(sid, obj), int(obj["off"]))
            self.requeues[key].append((t, "head", -1))

    def trace(self) -> Trace:
        """The trace, every series in time order."""
        for r in self.recv.values():
            r.build()
        seg_offsets: dict[int, list[int]] = defaultdict(list)
        for conn, off in sorted(self.seg_len):
            seg_offsets[conn].append(off)
        for sv in self.sends.values():
            sv.sort(key=lambda s: s.t)
        for rv in self.requeues.values():
            rv.sort()
        for pv in self.samples.values():
            pv.sort(key=lambda x: x.t)
        return Trace(
            dict(self.recv),
            dict(self.sends),
            dict(seg_offsets),
            self.seg_len,
            dict(self.requeues),
            self.dropped,
            dict(self.samples),
            self.request_sent,
            self.request_arrived,
            self.window_sent,
            self.window_arrived,
            {k: sorted(v, key=lambda x: x[0]) for k, v in self.window_limited.items()},
        )


def _cid(sid: int, obj: dict[str, Any]) -> int:
    """A connection id unique across sessions."""
    return (sid << 32) | int(obj["conn"])


def stall_runs(d: Download) -> list[tuple[float, float]]:
    """(start, end) trip ms of the download's stalls: runs of progress samples with no new
    byte lasting at least STALL_MIN_MS, after the first byte (as losttime)."""
    prog, end = d.progress, d.end_ms
    if not prog or d.progress_bad or end is None:
        return []
    first = next((t for t, b in prog if b > 0), None)
    if first is None:
        return []
    pts = [(t, b) for t, b in prog if first <= t <= end]
    out: list[tuple[float, float]] = []
    run: tuple[float, float] | None = None
    for (t0, b0), (t1, b1) in pairwise(pts):
        if b1 == b0 and t1 > t0:
            run = (run[0], t1) if run else (t0, t1)
        else:
            if run and run[1] - run[0] >= STALL_MIN_MS:
                out.append(run)
            run = None
    if run and run[1] - run[0] >= STALL_MIN_MS:
        out.append(run)
    return out


def conn_of(d: Download, tr: Trace) -> int | None:
    """The connection that carried download ``d``: the one with the most new bytes received
    during it (downloads of one scheme do not overlap in the bulk phase)."""
    if d.end_ms is None:
        return None
    best, best_n = None, 0
    for conn, r in tr.recv.items():
        n = r.bytes_between(d.start_ms - 50, d.end_ms + 50)
        if n > best_n:
            best, best_n = conn, n
    return best


def explain(stall: tuple[float, float], conn: int, tr: Trace) -> dict[str, Any]:
    """What the passenger waited for during ``stall``, and why (see the module doc)."""
    s, e = stall
    out: dict[str, Any] = {"start_ms": s, "end_ms": e, "stall_ms": e - s, "conn": conn}
    r = tr.recv.get(conn)
    if r is None:
        return out | {"kind": "unmatched", "why": "no arrivals traced"}
    head = r.contig_at(s)
    out["head_off"] = head
    seg = tr.segment_of(conn, head)
    passed = r.passes(head)
    if seg is None or passed is None:
        return out | {"kind": "unmatched", "why": "head segment not in the sender's trace"}
    t_arrive, p_arrive = passed
    sends = tr.sends[(conn, seg)]
    first = sends[0]
    out.update(
        {
            "first_sent_ms": first.t,
            "first_path": first.path,
            "arrived_ms": t_arrive,
            "arrived_path": p_arrive,
            "copies": [[x.t, x.path, x.copy] for x in sends],
        }
    )
    if first.t >= s:
        return out | {"kind": "not_sent", "wait_send_ms": first.t - s}
    # The copy that ended the stall: the last one sent before the arrival on the arriving path.
    arriving = [x for x in sends if x.t <= t_arrive and x.path == p_arrive]
    copy = arriving[-1] if arriving else first
    if copy is first:
        return out | {"kind": "slow", "transit_ms": t_arrive - first.t}
    causes = [c for c in tr.requeues.get((conn, seg), []) if c[0] <= copy.t]
    if copy.copy == "redundant":
        # A copy placed next to the first one (idle-inject, redundant schedulers).
        cause: tuple[float, str, int] = (copy.t, "redundant", -1)
    else:
        cause = causes[-1] if causes else (copy.t, "unknown", -1)
    return out | {
        "kind": "stranded",
        "cause": cause[1],
        "wait_resend_ms": max(0.0, copy.t - s),
        "resend_transit_ms": t_arrive - copy.t,
        "resend_path": copy.path,
        "since_first_sent_ms": copy.t - first.t,
    }


#: Payload bytes per downlink opportunity, as the oracle counts them.
PAYLOAD = 1448
PATH_STATES = ("available", "full", "stale", "timeout")


def _state(x: PathSample) -> str:
    if x.rto_count > 0:
        return "timeout"
    if x.stale:
        return "stale"
    return "full" if x.avail == "full" else "available"


def path_use(
    d: Download, conn: int, tr: Trace, carriers: list[Carrier]
) -> dict[int, dict[str, Any]] | None:
    """Per path, over the download (request to last byte): the carrier's downlink capacity
    (opportunities outside blackouts x 1448 bytes), the bytes of the download it delivered
    (every copy that reached the relay), and the share of the proxy's path samples in each
    state: ``available`` (room in the window: nothing more to send, the connection's window
    or the origin held it back), ``full`` (window or queue full), ``stale``, ``timeout``
    (retransmission timeout, no acknowledgement since)."""
    if d.end_ms is None or not carriers:
        return None
    s, e = d.start_ms, d.end_ms
    r = tr.recv.get(conn)
    out: dict[int, dict[str, Any]] = {}
    for i, c in enumerate(carriers):
        times, _ = c.downlink(e)
        cap = int(np.searchsorted(times, e) - np.searchsorted(times, s)) * PAYLOAD
        got = sum(ln for t, p, _, ln, _ in (r.events if r else []) if p == i and s <= t <= e)
        states = [_state(x) for x in tr.samples.get(i, []) if s <= x.t <= e]
        n = len(states)
        out[i] = {
            "capacity_bytes": cap,
            "delivered_bytes": got,
            "samples": n,
            "state_share": {k: (states.count(k) / n if n else None) for k in PATH_STATES},
        }
    return out


SETUP_PARTS = ("to_relay", "request", "server", "response")


def setup(d: Download, conn: int, tr: Trace) -> dict[str, Any] | None:
    """Where a download's set-up time goes, from the traces (trip ms): ``to_relay`` (the
    passenger's request reaching the relay and leaving it: connection interception, OPEN),
    ``request`` (its first byte's trip to the proxy, on ``request_path`` and arriving on
    ``request_arrival_path``), ``server`` (the proxy's upstream connect and the origin's
    answer, up to the response's first segment leaving the proxy) and ``response`` (that
    segment's trip to the relay). None when a step is missing from the traces."""
    sent, arrived = tr.request_sent.get(conn), tr.request_arrived.get(conn)
    first = tr.sends.get((conn, 0))
    r = tr.recv.get(conn)
    got = min((t for t, _, o, _, _ in r.events if o == 0), default=None) if r else None
    if sent is None or arrived is None or not first or got is None:
        return None
    return {
        "to_relay": sent[0] - d.start_ms,
        "request": arrived[0] - sent[0],
        "server": first[0].t - arrived[0],
        "response": got - first[0].t,
        "request_path": sent[1],
        "request_arrival_path": arrived[1],
    }


def window_transits(tr: Trace) -> list[tuple[int, float]]:
    """(path it was sent on, ms to its first arrival) of every WINDOW frame the relay sent
    and the proxy received: how long the sender's new credit took to arrive."""
    out = []
    for key, (t, p) in tr.window_sent.items():
        got = tr.window_arrived.get(key)
        if got is not None:
            out.append((p, got[0] - t))
    return out


def _window_summary(rows: list[tuple[int, float]]) -> dict[str, Any]:
    def stats(v: list[float]) -> dict[str, Any]:
        return {
            "n": len(v),
            "median_ms": float(np.median(v)) if v else None,
            "p90_ms": float(np.percentile(v, 90)) if v else None,
        }

    by_path = {str(p): stats([x for q, x in rows if q == p]) for p in sorted({q for q, _ in rows})}
    return stats([x for _, x in rows]) | {"by_path": by_path}


def _setup_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for k in SETUP_PARTS:
        v = sorted(x[k] for x in rows)
        out[f"{k}_median_ms"] = float(np.median(v)) if v else None
        out[f"{k}_p90_ms"] = float(np.percentile(v, 90)) if v else None
    out["request_rerouted"] = sum(x["request_path"] != x["request_arrival_path"] for x in rows)
    dur = sum(x.get("duration_ms", 0.0) for x in rows)
    out["window_limited_share"] = (
        sum(x.get("window_limited_ms", 0.0) for x in rows) / dur if dur > 0 else None
    )
    return out


def _path_use_summary(per: list[dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Sums over downloads: per path, capacity and delivered bytes, their ratio, and the
    state shares weighted by samples."""
    paths: dict[int, dict[str, Any]] = {}
    for u in per:
        for p, x in u.items():
            acc = paths.setdefault(
                p, {"capacity_bytes": 0, "delivered_bytes": 0, "samples": 0, "state_n": {}}
            )
            acc["capacity_bytes"] += x["capacity_bytes"]
            acc["delivered_bytes"] += x["delivered_bytes"]
            acc["samples"] += x["samples"]
            for k, v in x["state_share"].items():
                if v is not None:
                    acc["state_n"][k] = acc["state_n"].get(k, 0) + v * x["samples"]
    out: dict[str, Any] = {}
    for p, acc in sorted(paths.items()):
        n = acc["samples"]
        out[str(p)] = {
            "capacity_bytes": acc["capacity_bytes"],
            "delivered_bytes": acc["delivered_bytes"],
            "used_share": (
                acc["delivered_bytes"] / acc["capacity_bytes"] if acc["capacity_bytes"] else None
            ),
            "state_share": {k: (acc["state_n"].get(k, 0) / n if n else None) for k in PATH_STATES},
        }
    return out


def _summary(stalls: list[dict[str, Any]], n_downloads: int) -> dict[str, Any]:
    total = sum(x["stall_ms"] for x in stalls)
    by_kind = {k: sum(x["stall_ms"] for x in stalls if x["kind"] == k) for k in KINDS}
    stranded = [x for x in stalls if x["kind"] == "stranded"]
    by_cause: dict[str, float] = defaultdict(float)
    for x in stranded:
        by_cause[x["cause"]] += x["stall_ms"]
    return {
        "downloads": n_downloads,
        "stalls": len(stalls),
        "stall_ms": total,
        "by_kind_ms": by_kind,
        "by_kind_share": {k: (v / total if total else None) for k, v in by_kind.items()},
        "stranded": {
            "n": len(stranded),
            "wait_resend_ms": sum(x["wait_resend_ms"] for x in stranded),
            "resend_transit_ms": sum(x["resend_transit_ms"] for x in stranded),
            "by_cause_ms": dict(by_cause),
        },
    }


def trip_carriers(tdir: Path, issues: Issues) -> list[Carrier]:
    """The trip's carriers (``TRIP/trip/c<i>.*``); none, with the reason in ``issues``, when
    its link files cannot be read."""
    try:
        return load_carriers(tdir / "trip")
    except (OSError, ValueError) as e:
        issues.add("unreadable link files", f"{tdir}: {e}")
        return []


def analyse_scheme(
    sdir: Path, epoch_ms: float, issues: Issues, carriers: list[Carrier] | None = None
) -> dict[str, Any] | None:
    """The stalls (and, with the trip's carriers, the paths' use) of one scheme's bulk
    downloads on one trip; None without a trace."""
    tr = read_trace(sdir / "trace", epoch_ms, issues)
    if tr is None:
        return None
    downloads = (
        read_downloads(sdir / "bulk.jsonl", issues) if (sdir / "bulk.jsonl").exists() else []
    )
    stalls: list[dict[str, Any]] = []
    use: list[dict[int, dict[str, Any]]] = []
    setups: list[dict[str, Any]] = []
    for d in downloads:
        conn = conn_of(d, tr)
        if conn is not None and carriers:
            u = path_use(d, conn, tr, carriers)
            if u is not None:
                use.append(u)
        if conn is not None:
            su = setup(d, conn, tr)
            if su is not None and d.end_ms is not None:
                wl = tr.window_limited_ms(conn, d.start_ms, d.end_ms)
                setups.append(
                    su
                    | {
                        "download": d.id,
                        "label": d.label,
                        "duration_ms": d.end_ms - d.start_ms,
                        "window_limited_ms": wl,
                    }
                )
        for st in stall_runs(d):
            if conn is None:
                x: dict[str, Any] = {"start_ms": st[0], "end_ms": st[1], "stall_ms": st[1] - st[0]}
                stalls.append(x | {"kind": "unmatched", "why": "no connection", "download": d.id})
            else:
                stalls.append(explain(st, conn, tr) | {"download": d.id, "label": d.label})
    return {
        "dropped_records": tr.dropped,
        "summary": _summary(stalls, len(downloads)),
        "stalls": stalls,
        "path_use": use,
        "setup": setups,
        "window_transits": window_transits(tr),
    }


METHODS = {
    "stall_causes": (
        "bulk downloads of schemes run with SEGMENT_TRACE=1: each stall (>= 300 ms without a "
        "new byte at the passenger) is traced to the segment at the relay's in-order point "
        "when it began; stranded: its first copy's path did not deliver it in time and a copy "
        "sent again ended the stall (wait_resend = resend time - stall start, by the cause "
        "of the resend: rto, stale, down, head; resend_transit = arrival - resend); slow: "
        "the first copy arrived on its own path; not_sent: the proxy wrote it only after the "
        "stall began; unmatched: no trace record explains it. Milliseconds, summed over "
        "downloads and trips; path_use per carrier: capacity_bytes (downlink opportunities "
        "outside blackouts between a download's request and last byte, x 1448), "
        "delivered_bytes (every DATA frame of the download the relay received on it), "
        "used_share, and state_share of the proxy's 100 ms path samples in the window: "
        "available, full, stale, timeout"
    ),
}


def _scheme_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One scheme's summary over its trips' :func:`analyse_scheme` results."""
    stalls = [x for r in results for x in r["stalls"]]
    return _summary(stalls, sum(r["summary"]["downloads"] for r in results)) | {
        "dropped_records": sum(r["dropped_records"] for r in results),
        "path_use": _path_use_summary([u for r in results for u in r["path_use"]]),
        "setup": _setup_summary([x for r in results for x in r["setup"]]),
        "window_frames": _window_summary([w for r in results for w in r["window_transits"]]),
    }


def link_set_stalls(
    set_dir: Path, trips: Iterable[str], schemes: Iterable[str], issues: Issues
) -> dict[str, Any] | None:
    """``stall_causes`` of one link set of a bench-hsr run (``set_dir`` = RUN/<link_set>):
    per scheme the summary over its trips, and per trip each scheme's summary. None when no
    scheme of any trip has a segment trace."""
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_trip: dict[str, dict[str, Any]] = {}
    for trip in trips:
        tdir = set_dir / trip
        try:
            epoch = float(json.loads((tdir / "timing.json").read_text())["epoch_unix_ms"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        carriers: list[Carrier] | None = None
        for scheme in schemes:
            if not (tdir / scheme / "trace").is_dir():
                continue
            if carriers is None:
                carriers = trip_carriers(tdir, issues)
            res = analyse_scheme(tdir / scheme, epoch, issues, carriers)
            if res is None:
                continue
            per[scheme].append(res)
            by_trip.setdefault(trip, {})[scheme] = res["summary"]
    if not per:
        return None
    return {"schemes": {s: _scheme_summary(v) for s, v in per.items()}, "trips": by_trip}


def analyse_run(root: Path, schemes: Iterable[str] | None = None) -> dict[str, Any]:
    """Every traced scheme of every trip under ``root`` (a bench-hsr run directory)."""
    issues = Issues()
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    trips: dict[str, Any] = {}
    for timing in sorted(root.glob("*/*/timing.json")):
        tdir = timing.parent
        meta = json.loads(timing.read_text())
        epoch = float(meta["epoch_unix_ms"])
        traced = sorted(p for p in tdir.iterdir() if (p / "trace").is_dir())
        carriers = trip_carriers(tdir, issues) if traced else []
        for sdir in traced:
            if schemes is not None and sdir.name not in schemes:
                continue
            res = analyse_scheme(sdir, epoch, issues, carriers)
            if res is None:
                continue
            trips.setdefault(f"{tdir.parent.name}/{tdir.name}", {})[sdir.name] = res
            per[sdir.name].append(res)
    return {
        "method": __doc__,
        "schemes": {s: _scheme_summary(v) for s, v in per.items()},
        "trips": trips,
        "issues": issues.to_json(),
    }


def _table(doc: dict[str, Any]) -> str:
    rows = [
        "| scheme | downloads | stalls | stalled s | stranded | slow | not sent | unmatched "
        "| stranded: wait to resend s | resend transit s | causes (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, x in doc["schemes"].items():
        sh = x["by_kind_share"]
        st = x["stranded"]

        def pct(v: float | None) -> str:
            return "–" if v is None else f"{100 * v:.0f} %"

        causes = ", ".join(f"{c} {v / 1000:.1f}" for c, v in sorted(st["by_cause_ms"].items()))
        rows.append(
            f"| `{s}` | {x['downloads']} | {x['stalls']} | {x['stall_ms'] / 1000:.1f} | "
            f"{pct(sh['stranded'])} | {pct(sh['slow'])} | {pct(sh['not_sent'])} | "
            f"{pct(sh['unmatched'])} | {st['wait_resend_ms'] / 1000:.1f} | "
            f"{st['resend_transit_ms'] / 1000:.1f} | {causes or '–'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="bench-hsr run directory (SEGMENT_TRACE=1)")
    p.add_argument("--out", type=Path, help="write the JSON here")
    p.add_argument("--schemes", nargs="*", help="only these schemes")
    a = p.parse_args(argv)
    prov = provenance.of_run(a.run, a.out) if a.out else None
    doc = analyse_run(a.run, a.schemes)
    if not doc["schemes"]:
        print(
            f"stalls: no segment trace under {a.run} (run bench-hsr with SEGMENT_TRACE=1)",
            file=sys.stderr,
        )
        return 1
    if prov:
        a.out.write_text(json.dumps(prov.stamp(doc), indent=1) + "\n")
    print(_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
