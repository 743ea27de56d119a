"""The numbers the docs quote are generated from bench/out, and a test fails when they differ."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polycorn_bench import docnumbers
from polycorn_bench.docnumbers import (
    FILES,
    FULL_REGIONS,
    HSR_JSON,
    HSR_V1_JSON,
    PRECISION_JSON,
    REGIONS,
    ROOT,
    DocError,
    Region,
    Sources,
    main,
    num,
    pct,
    pct_ci,
    ratio_ci,
    regenerate,
    run,
    sig2,
    table,
)


def test_docs_agree_with_bench_out() -> None:
    """CI's guard: README.md and docs/results.md say what bench/out says. If this fails, run
    `uv run --project bench --locked python -m polycorn_bench.docnumbers` (after checking
    that bench/out is what should be reported)."""
    stale, names = run(ROOT, check=True)
    assert stale == [], "stale generated regions: " + ", ".join(
        f"{s.file}:{s.line} {s.name}" for s in stale
    )
    # Every region the generator knows is used somewhere, exactly once.
    assert sorted(names) == sorted(REGIONS)


@pytest.fixture
def fake_regions(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"a": "| x |\n|---|\n| 1 |", "b": "one sentence"}
    monkeypatch.setattr(
        docnumbers,
        "REGIONS",
        {
            "tbl": Region(lambda _src: values["a"]),
            "line": Region(lambda _src: values["b"], inline=True),
        },
    )
    return values


def test_regenerate_block_and_inline(fake_regions: dict[str, str], tmp_path: Path) -> None:
    text = (
        "Intro.\n\n<!-- generated:tbl -->\nold table\n<!-- /generated -->\n\n"
        "It says <!-- generated:line -->old<!-- /generated --> here.\n"
    )
    new, stale, names = regenerate(text, Sources(tmp_path), "doc.md")
    assert names == ["tbl", "line"]
    assert [(s.name, s.line) for s in stale] == [("tbl", 3), ("line", 7)]
    assert new == (
        "Intro.\n\n<!-- generated:tbl -->\n| x |\n|---|\n| 1 |\n\n<!-- /generated -->\n\n"
        "It says <!-- generated:line -->one sentence<!-- /generated --> here.\n"
    )
    # Idempotent: a second pass changes nothing.
    again, stale, _ = regenerate(new, Sources(tmp_path), "doc.md")
    assert again == new
    assert stale == []
    fake_regions["b"] = "another sentence"
    _, stale, _ = regenerate(new, Sources(tmp_path), "doc.md")
    assert [s.name for s in stale] == ["line"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- generated:nope -->x<!-- /generated -->", "unknown generated region 'nope'"),
        ("a\n<!-- generated:tbl -->\nno end\n", "'tbl' is not closed"),
        (
            "<!-- generated:tbl -->x<!-- generated:line -->y<!-- /generated -->",
            "'tbl' is not closed",
        ),
        ("text <!-- /generated --> more", "closing marker(s) without an opening one"),
    ],
)
def test_bad_markers(fake_regions: dict[str, str], tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DocError, match=message.replace("(", r"\(").replace(")", r"\)")):
        regenerate(text, Sources(tmp_path), "doc.md")


def copy_repo_docs(tmp_path: Path) -> Path:
    """The documented files and their sources (every ``*_JSON`` the generator names), in a
    scratch root."""
    sources = tuple(
        v for k, v in vars(docnumbers).items() if k.endswith("_JSON") and isinstance(v, str)
    )
    assert HSR_JSON in sources and PRECISION_JSON in sources
    for rel in (*FILES, *sources):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_check_fails_on_a_stale_number_and_the_generator_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_repo_docs(tmp_path)
    results = root / "docs/results-archive.md"
    text = results.read_text(encoding="utf-8")
    # Seed a hand edit inside a generated table: hrsch's overall ratio on the first railway.
    edited = text.replace(
        "| overall (n = 150) | 0.97 [0.90, 1.02]", "| overall (n = 150) | 1.31 [1.20, 1.40]"
    )
    assert edited != text
    results.write_text(edited, encoding="utf-8")
    assert main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/results-archive.md:" in err
    assert "'hsr-hrsch-sizes' differs from bench/out" in err
    assert results.read_text(encoding="utf-8") == edited  # --check writes nothing
    assert main(["--root", str(root)]) == 0
    assert "1 rewritten: hsr-hrsch-sizes" in capsys.readouterr().out
    assert results.read_text(encoding="utf-8") == text
    assert main(["--check", "--root", str(root)]) == 0


def test_missing_source_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_repo_docs(tmp_path)
    (root / HSR_V1_JSON).unlink()
    assert main(["--check", "--root", str(root)]) == 2
    assert "bench/out/hsr-v1.json" in capsys.readouterr().err


def test_a_region_reads_the_full_run_it_is_bound_to(tmp_path: Path) -> None:
    """The first railway's regions read hsr-v1.json, the latest full run's hsr.json, through
    one cache."""
    (tmp_path / "bench/out").mkdir(parents=True)
    (tmp_path / HSR_JSON).write_text('{"seeds": ["new"]}', encoding="utf-8")
    (tmp_path / HSR_V1_JSON).write_text('{"seeds": ["v1"]}', encoding="utf-8")
    src = Sources(tmp_path)
    assert src.hsr["seeds"] == ["new"]
    assert src.on(HSR_V1_JSON).hsr["seeds"] == ["v1"]
    assert src.hsr["seeds"] == ["new"]  # the original is unchanged
    with pytest.raises(DocError, match=r"hsr-v1\.json: no link set 'x'"):
        src.on(HSR_V1_JSON).link_set("x")


def test_the_full_runs_regions_render_from_a_full_run(tmp_path: Path) -> None:
    """The full-* regions, read from the first railway's full run with the default pipeline's
    section filled in as hrsch's (the current full run has its own)."""
    doc = json.loads((ROOT / HSR_V1_JSON).read_text(encoding="utf-8"))
    doc["default_scheme"] = "hrsch"
    doc["default_vs_baselines"] = doc["hrsch_vs_baselines"]
    for per in doc["hrsch_vs_baselines"].values():
        for e in per.values():
            e.setdefault("goal", 1.45)
            e.setdefault("goal_verdict", "below")
    doc["im_default"] = doc["im_hrsch"]
    (tmp_path / "bench/out").mkdir(parents=True)
    (tmp_path / HSR_JSON).write_text(json.dumps(doc), encoding="utf-8")
    src = Sources(tmp_path)
    out = {name: r.render(src) for name, r in FULL_REGIONS.items()}
    assert "0.97 [0.90, 1.02]" in out["full-sizes"]
    assert "| **below the paper** | **below the goal** |" in out["full-sizes"]
    assert "| `kernel-mptcp` |" in out["full-every-scheme"]
    assert "mahimahi: × `minrtt` (rank)" in out["full-link-sets"]
    assert "94 failed handovers on 5 trips" in out["full-recovery"]
    assert set(FULL_REGIONS) <= set(REGIONS)


def test_formatting() -> None:
    assert num(-0.123) == "−0.12"
    assert num(-0.001) == "0.00"  # no negative zero
    assert num(None) == "–"
    assert ratio_ci(0.9652, [0.9047, 1.0246]) == "0.97 [0.90, 1.02]"
    assert ratio_ci(1.36, None) == "1.36"
    assert pct(-0.1016) == "−10.2 %"
    assert pct(0.42, 0, plus=False) == "42 %"
    assert pct_ci(0.056, [0.001, 0.114]) == "+5.6 % [+0.1, +11.4]"
    assert pct_ci(-0.107, [-0.213, -0.0004]) == "−10.7 % [−21.3, 0.0]"
    assert [sig2(x) for x in (0.0573, 0.00657, 0.0031, 0.47)] == ["5.7", "0.66", "0.31", "47"]
    assert table(["a", "b"], [["1", ""]]) == "| a | b |\n|---|---|\n| 1 | |"
