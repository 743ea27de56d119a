"""Each invariant check fails on the fault it exists to catch (seeded here),
and passes on what a healthy episode records."""

import json
from pathlib import Path

from polycorn_chaos.checks import (
    TelemetryLedger,
    Transfer,
    TripTelemetry,
    check_chat,
    check_rss,
    check_telemetry,
    check_transfers,
    check_unready_during,
)

SUMS = {"1MiB.bin": ("ab" * 32, 1 << 20)}


def test_intact_and_visibly_failed_transfers_pass() -> None:
    counts, bad = check_transfers(
        [
            Transfer("p", "1MiB.bin", 0, "ab" * 32, 1 << 20),
            Transfer("p", "1MiB.bin", 18, "cd" * 32, 4096, "transfer closed"),
        ],
        SUMS,
    )
    assert bad == []
    assert (
        counts["completed"] == 1 and counts["failed-visibly"] == 1 and counts["curl-exit-18"] == 1
    )


def test_a_corrupted_download_curl_called_complete_is_a_violation() -> None:
    # Seeded fault: one byte differs, so the hash does.
    _, bad = check_transfers([Transfer("p", "1MiB.bin", 0, "ac" + "ab" * 31, 1 << 20)], SUMS)
    assert [v.invariant for v in bad] == ["transfer-intact"]
    _, bad = check_transfers([Transfer("p", "1MiB.bin", 0, "ab" * 32, (1 << 20) - 1)], SUMS)
    assert [v.invariant for v in bad] == ["transfer-intact"]


def chat(user: int, msg: int, ok: bool = True, error: str | None = None) -> dict[str, object]:
    return {"user": user, "msg": msg, "ok": ok, "error": error, "recv_ms": 1.0 if ok else None}


def test_chat_answered_or_failed_with_a_reason_passes() -> None:
    recs = [
        chat(0, 0),
        chat(0, 1, False, "receive reply: connection reset"),
        chat(1, 0),
        chat(1, 1, False, "deadline"),
    ]
    counts, bad = check_chat(recs, users=2, messages=2)
    assert bad == [] and counts["answered"] == 2 and counts["failed-visibly"] == 2


def test_chat_misdelivered_missing_duplicated_or_silent_is_a_violation() -> None:
    wrong = [chat(0, 0), chat(0, 1, False, "reply names message 7, expected 1")]
    assert [v.invariant for v in check_chat(wrong, 1, 2)[1]] == ["chat-intact"]
    missing = [chat(0, 0)]
    assert "no record" in check_chat(missing, 1, 2)[1][0].detail
    dup = [chat(0, 0), chat(0, 0), chat(0, 1)]
    assert "twice" in check_chat(dup, 1, 2)[1][0].detail
    silent = [chat(0, 0), chat(0, 1, False, None)]
    assert "without a reason" in check_chat(silent, 1, 2)[1][0].detail


def test_a_chat_message_left_hanging_is_a_violation() -> None:
    # Seeded fault: sent, then neither answered nor broken until the deadline.
    hung = {
        "user": 0,
        "msg": 0,
        "ok": False,
        "error": "deadline",
        "recv_ms": None,
        "send_ms": 1_000.0,
    }
    counts, bad = check_chat([hung], 1, 1, deadline_ms=40_000.0)
    assert counts["hanging"] == 1 and "hanging" in bad[0].detail
    # Sent shortly before the deadline: a visible failure, not a hang.
    late = dict(hung, send_ms=30_000.0)
    assert check_chat([late], 1, 1, deadline_ms=40_000.0)[1] == []
    # Never sent: the deadline came first.
    unsent = dict(hung, send_ms=None)
    assert check_chat([unsent], 1, 1, deadline_ms=40_000.0)[1] == []


def trip(tmp_path: Path) -> TripTelemetry:
    events = [
        {"event": "gps", "t_ms": 1000},
        {"event": "handover_end", "carrier": 0, "t_ms": 1500, "duration_ms": 100},
        {"event": "gps", "t_ms": 2000},
        {"event": "handover_end", "carrier": 2, "t_ms": 2200, "duration_ms": 50},
        {"event": "gps", "t_ms": 3000},
        {"event": "gps", "t_ms": 9000},
    ]
    f = tmp_path / "events.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    return TripTelemetry.load(f, 10_000)


def test_trip_keys_are_the_harness_s(tmp_path: Path) -> None:
    t = trip(tmp_path)
    # carrier 2 is not one of polycorn_harness.trip's carriers; start = end - duration.
    assert t.handovers == ((("carrier-0", 11_400), 11_500),)
    assert [k for k, _ in t.fixes] == [11_000, 12_000, 13_000, 19_000]


def test_telemetry_exactly_once_passes_and_ignores_what_is_not_due(tmp_path: Path) -> None:
    stats, bad = check_telemetry(
        trip(tmp_path), [("carrier-0", 11_400)], [11_000, 12_000, 13_000], 14_000, TelemetryLedger()
    )
    assert bad == [] and stats["gps fixs due"] == 3


def test_a_duplicated_extra_or_missing_row_is_a_violation(tmp_path: Path) -> None:
    t = trip(tmp_path)
    ho = [("carrier-0", 11_400)]
    # Seeded faults: a duplicated fix row, a row the trip never had, a lost fix.
    for fixes, word in (
        ([11_000, 12_000, 12_000, 13_000], "duplicated"),
        ([11_000, 12_000, 13_000, 13_001], "extra"),
        ([11_000, 13_000], "missing"),
    ):
        _, bad = check_telemetry(t, ho, fixes, 14_000, TelemetryLedger())
        assert len(bad) == 1 and word in bad[0].detail, (word, bad)
    _, bad = check_telemetry(t, [], [11_000, 12_000, 13_000], 14_000, TelemetryLedger())
    assert "handover" in bad[0].detail and "missing" in bad[0].detail


def test_losses_while_the_spool_was_full_are_allowed_only_as_far_as_counted(
    tmp_path: Path,
) -> None:
    t = trip(tmp_path)
    ho = [("carrier-0", 11_400)]
    ledger = TelemetryLedger(lost_windows=[(11_800, 12_500)], spool_errors=1)
    stats, bad = check_telemetry(t, ho, [11_000, 13_000], 14_000, ledger)
    assert bad == [] and stats["gps fixs lost to a full spool"] == 1
    # Lost, but the relay counted no spool error: a silent loss.
    _, bad = check_telemetry(
        t, ho, [11_000, 13_000], 14_000, TelemetryLedger(lost_windows=[(11_800, 12_500)])
    )
    assert len(bad) == 1 and "silent loss" in bad[0].detail
    # Outside the window it is missing whatever the count.
    _, bad = check_telemetry(t, ho, [11_000, 12_000], 14_000, ledger)
    assert len(bad) == 1 and "missing" in bad[0].detail


def test_a_difference_is_reported_once_across_episodes(tmp_path: Path) -> None:
    t = trip(tmp_path)
    ledger = TelemetryLedger()
    assert len(check_telemetry(t, [("carrier-0", 11_400)], [11_000], 14_000, ledger)[1]) == 1
    assert check_telemetry(t, [("carrier-0", 11_400)], [11_000], 14_000, ledger)[1] == []


def test_a_relay_ready_while_its_proxy_is_down_is_a_violation() -> None:
    ok = [(0.0, True), (1.0, True), (2.5, False), (3.0, False)]
    assert check_unready_during("relay", "x", samples=ok, start=0.5, end=8, grace_s=5) == []
    # Seeded fault: the relay keeps saying ready.
    stuck = [(float(t), True) for t in range(10)]
    bad = check_unready_during(
        "relay", "its proxy was down", samples=stuck, start=0.5, end=8, grace_s=5
    )
    assert len(bad) == 1 and "never" in bad[0].detail
    late = [(0.0, True), (7.0, False)]
    assert (
        "after 6.5 s"
        in check_unready_during("relay", "x", samples=late, start=0.5, end=8, grace_s=5)[0].detail
    )
    # A fault shorter than the grace is not judged.
    assert check_unready_during("relay", "x", samples=stuck, start=0, end=3, grace_s=5) == []


def test_memory_growth_and_ceiling() -> None:
    mib = 1 << 20
    assert check_rss("relay", 1, [30 * mib] * 20) == []
    grow = [(30 + 20 * i) * mib for i in range(10)]
    assert "grew" in check_rss("relay", 1, grow)[0].detail
    assert "ceiling" in check_rss("relay", 1, [600 * mib])[0].detail
