"""Builders for tiny synthetic run directories."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest


def write_trace(path: Path, per_ms: int, period_ms: int) -> None:
    """A constant-rate trace: ``per_ms`` opportunities in every ms 1..period_ms."""
    lines = [str(t) for t in range(1, period_ms + 1) for _ in range(per_ms)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict[str, Any]], extra_lines: Sequence[str] = ()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows) + "".join(x + "\n" for x in extra_lines)
    path.write_text(text, encoding="utf-8")


def download(
    ident: int, start: float, dur: float | None, size: int = 1_048_576, **kw: Any
) -> dict[str, Any]:
    label = {262144: "256KB", 1048576: "1MB", 4194304: "4MB"}[size]
    rec = {
        "id": ident,
        "label": label,
        "size": size,
        "planned_ms": start,
        "start_ms": start,
        "end_ms": None if dur is None else start + dur,
        "bytes": size if dur is not None else 0,
        "ok": dur is not None,
        "timeout": False,
        "error": None,
    }
    rec.update(kw)
    return rec


def backlog(
    nbytes: int, start: float = 100_000.0, end: float = 200_000.0, **kw: Any
) -> dict[str, Any]:
    """A ``backlog.jsonl`` record without a progress curve: ``nbytes`` over [start, end]."""
    rec: dict[str, Any] = {
        "kind": "backlog",
        "id": 0,
        "label": "backlog",
        "size": 104_857_600,
        "planned_ms": start,
        "start_ms": start,
        "end_ms": end,
        "bytes": nbytes,
        "requests": 1,
        "completed": 0,
        "failed": 0,
        "errors": [],
        "late": False,
    }
    rec.update(kw)
    return rec


class RunBuilder:
    def __init__(self, root: Path, schemes: list[str], trips: list[str], link_set: str = "hsr"):
        self.root = root
        self.link_set = link_set
        self.trips = trips
        self.meta: dict[str, Any] = {
            "profile": "short",
            "commit": "abc123",
            "schemes": schemes,
            "bulk": {"per_size": 2, "sizes": {"256KB": 262144, "1MB": 1048576, "4MB": 4194304}},
            "im": {"users": [10, 20], "messages": 5, "mean_gap_ms": 100},
            "link_sets": {link_set: {"trips": trips, "description": "synthetic"}},
        }
        for trip in trips:
            tdir = self.trip_dir(trip)
            tdir.mkdir(parents=True, exist_ok=True)
            # 1 opportunity per ms = 1448 payload bytes/ms, 10 ms one-way delay.
            write_trace(tdir / "c0.down", 1, 60_000)
            write_trace(tdir / "c0.up", 1, 60_000)
            (tdir / "c0.schedule").write_text("delay 0 10\n", encoding="utf-8")

    def trip_dir(self, trip: str) -> Path:
        return self.root / self.link_set / trip / "trip"

    def scheme_dir(self, trip: str, scheme: str) -> Path:
        return self.root / self.link_set / trip / scheme

    def bulk(
        self, trip: str, scheme: str, rows: list[dict[str, Any]], extra: Sequence[str] = ()
    ) -> None:
        write_jsonl(self.scheme_dir(trip, scheme) / "bulk.jsonl", rows, extra)

    def im(self, trip: str, scheme: str, users: int, rows: list[dict[str, Any]]) -> None:
        write_jsonl(self.scheme_dir(trip, scheme) / f"im-{users}.jsonl", rows)

    def events(self, trip: str, t_ms: list[float]) -> None:
        rows: list[dict[str, Any]] = []
        for t in t_ms:
            rows.append({"event": "handover_start", "t_ms": t, "carrier": 0})
            rows.append(
                {"event": "handover_end", "t_ms": t + 50, "carrier": 0, "outcome": "success"}
            )
        write_jsonl(self.trip_dir(trip) / "events.jsonl", rows)

    def event_rows(self, trip: str, rows: list[dict[str, Any]]) -> None:
        write_jsonl(self.trip_dir(trip) / "events.jsonl", rows)

    def metrics(self, trip: str, scheme: str, relay: str | None, proxy: str | None) -> None:
        """Write logs/relay.metrics and logs/proxy.metrics (None: no file)."""
        logs = self.scheme_dir(trip, scheme) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name, text in (("relay.metrics", relay), ("proxy.metrics", proxy)):
            if text is not None:
                (logs / name).write_text(text, encoding="utf-8")

    def finish(self) -> Path:
        (self.root / "run.json").write_text(json.dumps(self.meta), encoding="utf-8")
        return self.root


@pytest.fixture
def builder(tmp_path: Path) -> RunBuilder:
    return RunBuilder(tmp_path / "run", ["minrtt", "redundant", "single-path"], ["r1-t1", "r1-t2"])


def handover(
    t: float, duration: float, outcome: str = "success", carrier: int = 0
) -> list[dict[str, Any]]:
    """A handover_start/handover_end pair as polycorn-tracegen writes them."""
    cells = {"from_cell": 3, "to_cell": 4}
    return [
        {"event": "handover_start", "t_ms": t, "carrier": carrier, "track_m": t / 12, **cells},
        {
            "event": "handover_end",
            "t_ms": t + duration,
            "carrier": carrier,
            "outcome": outcome,
            "duration_ms": duration,
            **cells,
        },
    ]


def relay_metrics(
    reinjected: float, redundant: float, down: float, up: float, duplicate: float | None = None
) -> str:
    """A relay snapshot in the exposition format of polycorn's metrics endpoint: capture
    counters per listener (down/up split over two listeners), scheduler counters."""
    return (
        "# HELP polycorn_capture_down_bytes Bytes to passengers.\n"
        "# TYPE polycorn_capture_down_bytes counter\n"
        f'polycorn_capture_down_bytes_total{{listener="transparent"}} {down - 10}\n'
        'polycorn_capture_down_bytes_total{listener="socks5"} 10.0\n'
        'polycorn_capture_down_bytes_total{listener="dns"} 0.0\n'
        f'polycorn_capture_up_bytes_total{{listener="transparent"}} {up}\n'
        'polycorn_capture_up_bytes_total{listener="dns"} 0.0\n'
        'polycorn_path_reinjected_bytes_total{path="0",name="carrier-0"} 999.0\n'
        f"polycorn_sched_redundant_bytes_total{{}} {redundant}\n"
        f"polycorn_sched_reinjected_bytes_total{{}} {reinjected}\n"
        + ("" if duplicate is None else f"polycorn_recv_duplicate_bytes_total{{}} {duplicate}\n")
        + "# EOF\n"
    )


def proxy_metrics(reinjected: float, redundant: float, duplicate: float | None = None) -> str:
    return (
        "# TYPE polycorn_sched_reinjected_bytes counter\n"
        f"polycorn_sched_reinjected_bytes_total{{}} {reinjected}\n"
        f"polycorn_sched_redundant_bytes_total {redundant}\n"
        "polycorn_sched_decisions_total{} 2776.0\n"
        + ("" if duplicate is None else f"polycorn_recv_duplicate_bytes_total{{}} {duplicate}\n")
    )


def failure_table_doc(entries: list[tuple[int, float]], version: int = 1) -> dict[str, Any]:
    """A polycorn-failure-table/1 document with one entry per (cell, position_m)."""
    return {
        "format": "polycorn-failure-table/1",
        "version": version,
        "source": "test",
        "entries": [
            {"cell": c, "direction": "increasing", "position_m": p, "failures": 1, "handovers": 2}
            for c, p in entries
        ],
    }


def progress(start: float, end: float, rate_per_ms: float) -> list[list[float]]:
    """A download's progress points every 100 ms at a constant rate (bytes per ms)."""
    pts, t = [], start
    while t < end:
        pts.append([t, (t - start) * rate_per_ms])
        t += 100
    pts.append([end, (end - start) * rate_per_ms])
    return pts
