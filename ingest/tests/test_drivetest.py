"""The drive-test importer: column mapping, handovers from cell changes, bad rows."""

from __future__ import annotations

import collections
import csv
import datetime as dt
import itertools
from pathlib import Path

import pytest
from helpers import query

from polycorn_ingest.cli import main
from polycorn_schema.testing import fresh_database

DATA = Path(__file__).parent / "data" / "drivetest.csv"
MAPPING = [
    "--time-col",
    "Timestamp",
    "--lat-col",
    "Latitude",
    "--lon-col",
    "Longitude",
    "--cell-col",
    "ECI",
    "--signal-col",
    "RSRP_dBm",
    "--delimiter",
    ";",
]


def run(url: str, *extra: str) -> int:
    return main(
        [
            "import-drivetest",
            str(DATA),
            "--database-url",
            url,
            "--train-id",
            "dt-1",
            "--carrier",
            "op-x",
            *MAPPING,
            *extra,
        ]
    )


def test_a_log_imports_with_mapped_columns_and_bad_rows_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with fresh_database() as url:
        assert run(url) == 0
        err = capsys.readouterr().err
        assert f"{DATA}:11: skipped: bad position" in err
        assert f"{DATA}:13: skipped: time 'yesterday' is not 'iso'" in err
        # A bad optional value empties that value only: the row is kept.
        assert f"{DATA}:12: RSRP '-inf' stored as empty" in err
        assert query(url, "SELECT id, source FROM trains") == [("dt-1", "drivetest")]
        assert query(url, "SELECT count(*) FROM gps_fixes") == [(12,)]
        assert query(url, "SELECT count(*) FROM signal_samples WHERE rsrp_dbm IS NULL") == [(3,)]
        hos = query(
            url,
            "SELECT source_cell_id, target_cell_id, outcome, duration_ms, "
            "direction, ST_X(geog::geometry) FROM handovers ORDER BY start_time",
        )
        assert hos == [
            (0x1A2B01, 0x1A2B02, "success", 1000, "increasing", 116.302),
            (0x1A2B02, 0x1A2B03, "failure", 3000, "increasing", 116.305),
            (0x1A2B03, 0x1A2B04, "success", 1000, "increasing", 116.312),
        ]
        assert query(url, "SELECT count(*) FROM cells WHERE handovers = 1") == [(3,)]
        assert query(url, "SELECT count(*) FROM signal_samples WHERE cell_id = 0") == [(2,)]
        before = query(url, "SELECT count(*), max(id) FROM handovers")
        assert run(url) == 0, "importing again is harmless"
        assert query(url, "SELECT count(*), max(id) FROM handovers") == before


def test_a_missing_column_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_database() as url:
        rc = main(
            [
                "import-drivetest",
                str(DATA),
                "--database-url",
                url,
                "--train-id",
                "dt-1",
                "--carrier",
                "op-x",
                "--delimiter",
                ";",
            ]
        )
        assert rc == 2
        assert "no column 'time'" in capsys.readouterr().err
        assert query(url, "SELECT count(*) FROM trains") == [(0,)]


def test_nothing_importable_exits_non_zero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,lat,lon,cell_id,rsrp\nnope,1,2,3,-90\n2026-11-18T10:00:00,95,2,3,-90\n")
    with fresh_database() as url:
        rc = main(
            [
                "import-drivetest",
                str(bad),
                "--database-url",
                url,
                "--train-id",
                "dt-2",
                "--carrier",
                "x",
            ]
        )
        assert rc == 1


# A real G-NetTrack Pro log: the UCC 5G dataset's drive of 2019-12-16 07:22
# (testbed/traces/ucc-5g/README.md; GPL-3.0, unmodified).
UCC = Path(__file__).parents[2] / "testbed" / "traces" / "ucc-5g" / "B_2019.12.16_07.22.43.csv"


def _ucc_reference() -> tuple[list[dict[str, str]], int, int]:
    """What the log says, read plainly: its rows kept (first per second),
    the serving-cell changes among them, and those with a gap over 2.5 s."""
    with UCC.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["Timestamp"])
    kept = [r for i, r in enumerate(rows) if i == 0 or r["Timestamp"] != rows[i - 1]["Timestamp"]]

    def t(r: dict[str, str]) -> dt.datetime:
        return dt.datetime.strptime(r["Timestamp"], "%Y.%m.%d_%H.%M.%S")

    changes = [(a, b) for a, b in itertools.pairwise(kept) if a["RAWCELLID"] != b["RAWCELLID"]]
    slow = sum((t(b) - t(a)).total_seconds() > 2.5 for a, b in changes)
    return kept, len(changes), slow


def test_a_public_gnettrack_log_imports_with_its_preset(capsys: pytest.CaptureFixture[str]) -> None:
    kept, changes, slow = _ucc_reference()
    with fresh_database() as url:
        rc = main(
            [
                "import-drivetest",
                str(UCC),
                "--database-url",
                url,
                "--train-id",
                "ucc-5g-b-20191216",
                "--format",
                "gnettrack",
                "--timezone",
                "Europe/Dublin",
            ]
        )
        out, err = capsys.readouterr()
        assert rc == 0, err
        assert "skipped" not in err and "stored as empty" not in err, err
        assert f"{len(kept)} imported" in out
        # One carrier (the dataset's anonymised operator "B"), on path 0;
        # cells are the global RAWCELLID, not the per-site CellID.
        assert query(url, "SELECT DISTINCT carrier, path FROM signal_samples") == [("B", 0)]
        cells = {int(r["RAWCELLID"]) for r in kept}
        assert {c for (c,) in query(url, "SELECT DISTINCT cell_id FROM signal_samples")} == cells
        assert query(url, "SELECT count(*), sum((outcome = 'failure')::int) FROM handovers") == [
            (changes, slow)
        ]
        # December in Ireland is UTC: the first row's local time is UTC.
        first = query(url, "SELECT min(time) FROM signal_samples")[0][0]
        assert first == dt.datetime(2019, 12, 16, 7, 22, 43, tzinfo=dt.UTC)
        # RSRQ, SINR (the log's SNR), network mode and speed (km/h -> m/s) kept.
        modes = dict(query(url, "SELECT rat, count(*) FROM signal_samples GROUP BY rat"))
        assert modes == dict(collections.Counter(r["NetworkMode"] for r in kept))
        got = query(
            url,
            "SELECT min(rsrq_db), max(rsrq_db), min(sinr_db), max(sinr_db) FROM signal_samples",
        )[0]
        want = [float(r[k]) for k in ("RSRQ", "SNR") for r in kept]
        n = len(kept)
        assert got == (min(want[:n]), max(want[:n]), min(want[n:]), max(want[n:]))
        top = query(url, "SELECT max(speed_mps) FROM gps_fixes")[0][0]
        assert top == pytest.approx(max(float(r["Speed"]) for r in kept) / 3.6)


GNET_4G_HEADER = (
    "Timestamp,Longitude,Latitude,Speed,Operatorname,CellID,NetworkMode,RSRP,RSRQ,SNR,CQI,"
    "RSSI,DL_bitrate,UL_bitrate,State,NRxRSRP,NRxRSRQ,ServingCell_Lon,ServingCell_Lat,"
    "ServingCell_Distance"
)


def _gnet_4g_row(sec: int, op: str, cell: str, site: tuple[float, float], rsrq: str = "-12") -> str:
    return (
        f"2018.06.01_10.00.{sec:02d},-8.50{sec:02d},51.89,40,{op},{cell},LTE,-95,{rsrq},8.0,9,"
        f"-70,1000,100,D,-,-,{site[0]},{site[1]},500.0"
    )


def test_the_4g_layout_names_cells_by_site_and_splits_operators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The UCC 4G dataset has no RAWCELLID: cell 2 of one site and cell 2 of
    the next are different cells (the preset combines CellID with the
    serving cell's position). Two operators logged in one file are two
    carriers whose rows interleave; handovers are per carrier. A summer
    log's local time is an hour ahead of UTC. A bad RSRQ empties that value."""
    s1, s2 = (-8.49, 51.89), (-8.47, 51.90)
    lines = [GNET_4G_HEADER]
    for sec in range(10):
        lines.append(_gnet_4g_row(sec, "A", "2", s1 if sec < 5 else s2, "x" if sec == 7 else "-12"))
        lines.append(_gnet_4g_row(sec, "B", "1", s1))
    p = tmp_path / "A_2018.06.01_10.00.00.csv"
    p.write_text("\n".join(lines) + "\n")
    with fresh_database() as url:
        rc = main(
            [
                "import-drivetest",
                str(p),
                "--database-url",
                url,
                "--train-id",
                "ucc-4g",
                "--format",
                "gnettrack",
                "--timezone",
                "Europe/Dublin",
            ]
        )
        _, err = capsys.readouterr()
        assert rc == 0, err
        assert f"{p}:16: RSRQ 'x' stored as empty" in err
        assert query(url, "SELECT carrier, path, count(*) FROM signal_samples GROUP BY 1, 2") == [
            ("A", 0, 10),
            ("B", 1, 10),
        ]
        assert query(url, "SELECT count(*) FROM gps_fixes") == [(10,)]
        hos = query(url, "SELECT carrier, start_time, outcome FROM handovers")
        assert hos == [("A", dt.datetime(2018, 6, 1, 9, 0, 4, tzinfo=dt.UTC), "success")]
        assert query(url, "SELECT count(*) FROM signal_samples WHERE rsrq_db IS NULL") == [(1,)]


def test_a_cell_named_by_one_column_misses_the_site_change(tmp_path: Path) -> None:
    """The fault the preset avoids: CellID alone sees one cell all along."""
    p = tmp_path / "a.csv"
    rows = [
        _gnet_4g_row(s, "A", "2", (-8.49, 51.89) if s < 5 else (-8.47, 51.9)) for s in range(10)
    ]
    p.write_text("\n".join([GNET_4G_HEADER, *rows]) + "\n")
    with fresh_database() as url:
        base = ["import-drivetest", str(p), "--database-url", url, "--format", "gnettrack"]
        assert main([*base, "--train-id", "one", "--cell-col", "CellID"]) == 0
        assert query(url, "SELECT count(*) FROM handovers") == [(0,)]
        assert main([*base, "--train-id", "site", "--cell-col", "CellID,ServingCell_Lon"]) == 0
        assert query(url, "SELECT count(*) FROM handovers") == [(1,)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [str(DATA), *MAPPING, "--carrier", "x", "--timezone", "Mars/Olympus"],
            "unknown time zone",
        ),
        ([str(UCC), "--format", "gnettrack", "--rsrq-col", "RSRQ_dB"], "no column 'RSRQ_dB' in"),
        ([str(DATA), *MAPPING, "--carrier", "x", "--time-format", "%d/%m/%Y"], ":2: skipped: time"),
        ([str(DATA), *MAPPING], "name the carrier with --carrier"),
        ([str(DATA), *MAPPING, "--carrier", "x", "--speed-unit", "knots"], "invalid choice"),
    ],
)
def test_wrong_options_are_clear_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with fresh_database() as url:
        try:
            rc = main(["import-drivetest", "--database-url", url, "--train-id", "e", *args])
        except SystemExit as e:  # argparse refuses it before anything runs
            rc = int(e.code or 0)
        assert rc in {1, 2}
        assert message in capsys.readouterr().err
        assert query(url, "SELECT count(*) FROM signal_samples") == [(0,)]
