"""Stalls of bulk downloads explained from the endpoints' segment traces: the segment the
passenger waited for, and whether it was stranded on a path and sent again, slow on its own
path, or not sent yet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polycorn_bench import stalls
from polycorn_bench.records import Issues

EPOCH = 1_700_000_000_000.0
SEG = 16_000


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")


def _progress(points: list[tuple[float, float]]) -> list[list[float]]:
    return [[t, b] for t, b in points]


def scheme_dir(tmp_path: Path) -> Path:
    """One 4-segment download (conn 3) from trip time 1,000 ms:

    - segments 0 and 1 go on path 0 at 1,000 and arrive at 1,100;
    - segment 2 goes on path 1 at 1,000, whose link goes dark; path 1's RTO at 1,900 gives
      it back and it is sent again on path 0 at 1,900, arriving at 2,000 (stall 1,100-2,000:
      stranded, 800 ms waiting for the resend, 100 ms its trip);
    - segment 3 goes on path 0 at 1,950 and arrives at 2,600 (a slow path; the passenger's
      curve shows the stall from its next sample, 2,100-2,600);
    and a second download (conn 4) from 5,000 whose only segment leaves the proxy at 5,600
    (stall 5,100-5,700: not sent).
    """
    sdir = tmp_path / "run" / "hsr" / "r1-t1" / "minrtt"
    size = 4 * SEG
    prog1 = [(1000.0, 0.0), (1100.0, 2 * SEG)]
    prog1 += [(1100.0 + 100 * i, 2 * SEG) for i in range(1, 10)]  # until 2,000
    prog1 += [(2000.0 + 100 * i, 3 * SEG) for i in range(1, 7)]  # until 2,600
    prog1 += [(2700.0, float(size))]
    prog2 = [(5000.0, 0.0), (5100.0, 10.0)]
    prog2 += [(5100.0 + 100 * i, 10.0) for i in range(1, 7)]
    prog2 += [(5800.0, float(SEG + 10))]
    bulk = [
        {
            "id": 0,
            "label": "64KB",
            "size": size,
            "start_ms": 1000.0,
            "end_ms": 2700.0,
            "bytes": size,
            "ok": True,
            "timeout": False,
            "error": None,
            "progress": _progress(prog1),
        },
        {
            "id": 1,
            "label": "16KB",
            "size": SEG + 10,
            "start_ms": 5000.0,
            "end_ms": 5800.0,
            "bytes": SEG + 10,
            "ok": True,
            "timeout": False,
            "error": None,
            "progress": _progress(prog2),
        },
    ]
    _write(sdir / "bulk.jsonl", bulk)

    def t(ms: float) -> float:
        return EPOCH + ms

    def sent(
        ms: float, path: int, conn: int, off: int, copy: str, *, ln: int = SEG
    ) -> dict[str, Any]:
        return {
            "t_ms": t(ms),
            "ev": "sent",
            "path": path,
            "conn": conn,
            "off": off,
            "len": ln,
            "copy": copy,
        }

    def recv(
        ms: float, path: int, conn: int, off: int, new: int, *, ln: int = SEG
    ) -> dict[str, Any]:
        return {
            "t_ms": t(ms),
            "ev": "recv",
            "path": path,
            "conn": conn,
            "off": off,
            "len": ln,
            "new": new,
        }

    proxy = [
        sent(1000, 0, 3, 0, "first"),
        sent(1000, 0, 3, SEG, "first"),
        sent(1000, 1, 3, 2 * SEG, "first"),
        {"t_ms": t(1900), "ev": "rto", "path": 1, "count": 1, "in_flight": SEG, "action": "oldest"},
        {"t_ms": t(1900), "ev": "requeue", "path": 1, "conn": 3, "off": 2 * SEG, "cause": "rto"},
        sent(1900, 0, 3, 2 * SEG, "reinjection"),
        sent(1950, 0, 3, 3 * SEG, "first"),
        sent(5000, 0, 4, 0, "first", ln=10),
        sent(5600, 0, 4, 10, "first"),
        {"ev": "end", "dropped": 0, "bytes": 1},
    ]
    relay = [
        recv(1100, 0, 3, 0, SEG),
        recv(1100, 0, 3, SEG, SEG),
        recv(2000, 0, 3, 2 * SEG, SEG),
        recv(2600, 0, 3, 3 * SEG, SEG),
        recv(3000, 1, 3, 2 * SEG, 0),  # the stranded first copy, too late
        recv(5100, 0, 4, 0, 10, ln=10),
        recv(5700, 0, 4, 10, SEG),
        {"ev": "end", "dropped": 0, "bytes": 1},
    ]

    def sample(at: float, path: int, avail: str, rto: int) -> dict[str, Any]:
        return {
            "t_ms": t(at),
            "ev": "path",
            "path": path,
            "srtt_us": 100_000,
            "cwnd": 65_536,
            "in_flight": 0,
            "queued": 0,
            "rate_bps": 0,
            "stale": False,
            "avail": avail,
            "rto_count": rto,
        }

    proxy += [
        sample(1500, 0, "full", 0),
        sample(1600, 0, "available", 0),
        sample(1500, 1, "full", 1),
    ]
    _write(sdir / "trace" / "proxy-00000000000000aa.jsonl", proxy)
    # Carrier 0: one opportunity every ms; carrier 1: every 2 ms.
    trip = sdir.parent / "trip"
    trip.mkdir(parents=True, exist_ok=True)
    (trip / "c0.down").write_text("1\n", encoding="utf-8")
    (trip / "c1.down").write_text("2\n", encoding="utf-8")
    _write(sdir / "trace" / "relay-00000000000000aa.jsonl", relay)
    (sdir.parent / "timing.json").write_text(json.dumps({"epoch_unix_ms": EPOCH}), encoding="utf-8")
    return sdir


def test_each_stall_is_traced_to_the_segment_the_passenger_waited_for(tmp_path: Path) -> None:
    sdir = scheme_dir(tmp_path)
    doc = stalls.analyse_run(sdir.parent.parent.parent)
    got = doc["trips"]["hsr/r1-t1"]["minrtt"]["stalls"]
    assert [(x["start_ms"], x["end_ms"], x["kind"]) for x in got] == [
        (1100.0, 2000.0, "stranded"),
        (2100.0, 2600.0, "slow"),
        (5100.0, 5700.0, "not_sent"),
    ]
    stranded, slow, not_sent = got
    assert stranded["head_off"] == 2 * SEG
    assert stranded["first_path"] == 1 and stranded["arrived_path"] == 0
    assert stranded["cause"] == "rto"
    assert stranded["wait_resend_ms"] == 800.0
    assert stranded["resend_transit_ms"] == 100.0
    assert slow["transit_ms"] == 650.0
    assert not_sent["wait_send_ms"] == 500.0
    s = doc["schemes"]["minrtt"]
    assert s["stall_ms"] == 900.0 + 500.0 + 600.0
    assert s["by_kind_ms"] == {"stranded": 900.0, "slow": 500.0, "not_sent": 600.0, "unmatched": 0}
    assert s["stranded"]["by_cause_ms"] == {"rto": 900.0}


def test_a_run_without_traces_is_an_error_not_an_empty_table(tmp_path: Path, capsys: Any) -> None:
    sdir = scheme_dir(tmp_path)
    for f in (sdir / "trace").iterdir():
        f.unlink()
    (sdir / "trace").rmdir()
    assert stalls.main([str(sdir.parent.parent.parent)]) == 1
    assert "SEGMENT_TRACE=1" in capsys.readouterr().err


def test_malformed_trace_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    sdir = scheme_dir(tmp_path)
    f = next((sdir / "trace").glob("proxy-*"))
    f.write_text(f.read_text() + "not json\n" + json.dumps({"ev": "sent", "t_ms": 1}) + "\n")
    doc = stalls.analyse_run(sdir.parent.parent.parent)
    assert doc["issues"]["total"] == 2
    assert len(doc["trips"]["hsr/r1-t1"]["minrtt"]["stalls"]) == 3


def test_the_link_set_summary_reaches_the_report(tmp_path: Path) -> None:
    from polycorn_bench.records import Issues
    from polycorn_bench.report import _stall_section

    sdir = scheme_dir(tmp_path)
    sc = stalls.link_set_stalls(sdir.parent.parent, ["r1-t1"], ["minrtt", "hrsch"], Issues())
    assert sc is not None
    assert list(sc["schemes"]) == ["minrtt"], "a scheme without a trace is left out"
    assert sc["schemes"]["minrtt"]["stalls"] == 3
    assert sc["trips"]["r1-t1"]["minrtt"]["stall_ms"] == 2000.0
    text = "\n".join(_stall_section({"stall_causes": sc}))
    assert "| `minrtt` | 2 | 3 | 2.0 | 45 % | 25 % | 30 % | 0 % | 0.8 | 0.1 | rto 0.9 | 0 |" in text
    assert stalls.link_set_stalls(tmp_path / "nothing", ["r1-t1"], ["minrtt"], Issues()) is None


def test_each_paths_use_during_a_download_is_measured_against_its_capacity(tmp_path: Path) -> None:
    sdir = scheme_dir(tmp_path)
    doc = stalls.analyse_run(sdir.parent.parent.parent)
    first = doc["trips"]["hsr/r1-t1"]["minrtt"]["path_use"][0]  # the download of 1,000-2,700 ms
    assert first[0]["capacity_bytes"] == 1700 * stalls.PAYLOAD
    assert first[1]["capacity_bytes"] == 850 * stalls.PAYLOAD
    assert first[0]["delivered_bytes"] == 4 * SEG
    assert first[1]["delivered_bytes"] == 0, "the late copy on path 1 arrived after the download"
    assert first[0]["state_share"]["full"] == 0.5
    assert first[0]["state_share"]["available"] == 0.5
    assert first[1]["state_share"]["timeout"] == 1.0
    use = doc["schemes"]["minrtt"]["path_use"]
    assert use["0"]["capacity_bytes"] == (1700 + 800) * stalls.PAYLOAD
    assert use["0"]["used_share"] == (4 * SEG + 10 + SEG) / ((1700 + 800) * stalls.PAYLOAD)


def test_set_up_time_splits_into_the_requests_trip_the_server_and_the_responses_trip() -> None:
    from polycorn_bench.records import Download

    r = stalls.ConnRecv(events=[(1300.0, 1, 0, SEG, SEG)])
    tr = stalls.Trace(
        recv={5: r},
        sends={(5, 0): [stalls.Sent(1180.0, 1, "first")]},
        seg_offsets={5: [0]},
        seg_len={(5, 0): SEG},
        requeues={},
        dropped=0,
        request_sent={5: (1001.0, 0)},
        request_arrived={5: (1170.0, 1)},
    )
    d = Download(7, "1MB", 2**20, None, 1000.0, 3000.0, 2**20, True, False, None)
    got = stalls.setup(d, 5, tr)
    assert got == {
        "to_relay": 1.0,
        "request": 169.0,
        "server": 10.0,
        "response": 120.0,
        "request_path": 0,
        "request_arrival_path": 1,
    }
    summary = stalls._setup_summary([got])
    assert summary["request_rerouted"] == 1 and summary["server_median_ms"] == 10.0
    tr.request_arrived.clear()
    assert stalls.setup(d, 5, tr) is None, "a step missing from the trace: no breakdown"


def test_window_frames_are_matched_from_the_relay_to_the_proxy() -> None:
    tr = stalls.Trace(
        recv={},
        sends={},
        seg_offsets={},
        seg_len={},
        requeues={},
        dropped=0,
        window_sent={(5, 100): (1000.0, 0), (5, 200): (1100.0, 1)},
        window_arrived={(5, 100): (1090.0, 1)},
    )
    got = stalls.window_transits(tr)
    assert got == [(0, 90.0)], "the frame that never arrived is left out"
    s = stalls._window_summary(got)
    assert s["n"] == 1 and s["median_ms"] == 90.0 and s["by_path"]["0"]["n"] == 1


def test_window_limited_time_is_clipped_to_the_download() -> None:
    tr = stalls.Trace(
        recv={},
        sends={},
        seg_offsets={},
        seg_len={},
        requeues={},
        dropped=0,
        window_limited={5: [(100.0, True), (300.0, False), (500.0, True)]},
    )
    assert tr.window_limited_ms(5, 200.0, 600.0) == 200.0, (
        "100 ms of the first spell, 100 of the open one"
    )
    assert tr.window_limited_ms(5, 310.0, 490.0) == 0.0
    assert tr.window_limited_ms(6, 0.0, 1000.0) == 0.0


def test_sessions_are_kept_apart_and_a_cut_trace_is_reported(tmp_path: Path) -> None:
    d = tmp_path / "trace"
    # Two relay sessions (a restart) that both numbered their connection 1.
    _write(
        d / "relay-aa-1.jsonl",
        [
            {"t_ms": 10.0, "ev": "recv", "path": 0, "conn": 1, "off": 0, "len": 5, "new": 5},
            {"ev": "end", "dropped": 0, "bytes": 1},
        ],
    )
    _write(
        d / "relay-bb-2.jsonl",
        [
            {"t_ms": 20.0, "ev": "recv", "path": 1, "conn": 1, "off": 0, "len": 7, "new": 7},
            {"t_ms": 21.0, "ev": "dropped", "total": 4},
        ],
    )
    issues = Issues()
    tr = stalls.read_trace(d, 0.0, issues)
    assert tr is not None
    assert sorted(r.events[0][3] for r in tr.recv.values()) == [5, 7], "two connections, not one"
    assert tr.dropped == 4, "the running count of a trace cut short"
    assert issues.counts["trace without its end line (process killed?)"] == 1
