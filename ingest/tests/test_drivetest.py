"""The drive-test importer: column mapping, handovers from cell changes, bad rows."""

from __future__ import annotations

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
        assert f"{DATA}:11:" in err and f"{DATA}:12:" in err and f"{DATA}:13:" in err
        assert query(url, "SELECT id, source FROM trains") == [("dt-1", "drivetest")]
        assert query(url, "SELECT count(*) FROM gps_fixes") == [(11,)]
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
