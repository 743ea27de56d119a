"""The static stage's check that quoted benchmark results say where they came from
(scripts/check_bench_provenance.py): on a temporary repository, a quoted result without a full
commit or a clean tree fails, one with both passes, and the list of results that predate the
check only shrinks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from script_loader import load_script

from polycorn_harness import ROOT

prov = load_script("bench_provenance", "scripts/check_bench_provenance.py")

GOOD = {"commit": "0123456789abcdef0123456789abcdef01234567", "clean": True, "x": 1}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    out = tmp_path / "bench" / "out"
    out.mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(
        "From [the run](../bench/out/a.json) and `bench/out/b.{json,md}`;\n"
        "```\nbench/out/c.json\n```\n"
        "`bench/out/plots-x/` and bench/out/diagnostics/d/e.json are not results.\n",
        encoding="utf-8",
    )
    (tmp_path / "bench" / "README.md").write_text("[raw](out/e.json)\n", encoding="utf-8")
    for name in ("a", "b", "c", "e", "unquoted"):
        (out / f"{name}.json").write_text(json.dumps(GOOD), encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_links_names_and_braces_are_quoted_diagnostics_are_not(repo: Path) -> None:
    where = prov.quoted(repo)
    assert sorted(where) == ["a.json", "b.json", "c.json", "e.json"]
    assert where["a.json"] == ["docs/results.md:1"]
    assert where["e.json"] == ["bench/README.md:1"]
    assert prov.check(repo, frozenset(), frozenset()) == []


def test_a_seeded_fault_fails_a_quoted_result(repo: Path) -> None:
    a = repo / "bench" / "out" / "a.json"
    a.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "clean"}))
    assert prov.check(repo, frozenset(), frozenset()) == [
        "bench/out/a.json: not from a clean tree (clean: null); quoted in docs/results.md:1"
    ]
    a.write_text(json.dumps(GOOD | {"clean": False}))
    assert "(clean: false)" in prov.check(repo, frozenset(), frozenset())[0]
    a.write_text(json.dumps(GOOD | {"commit": "0123456"}))
    assert prov.check(repo, frozenset(), frozenset()) == [
        'bench/out/a.json: no full commit (commit: "0123456"); quoted in docs/results.md:1'
    ]
    a.write_text("[]")
    assert "not a JSON object" in prov.check(repo, frozenset(), frozenset())[0]
    # Listed as predating provenance, it may fail.
    assert prov.check(repo, frozenset({"a.json"}), frozenset()) == []


def test_the_list_only_shrinks(repo: Path) -> None:
    assert prov.check(repo, frozenset({"a.json", "gone.json"}), frozenset()) == [
        "bench/out/a.json: records its commit and a clean tree now: take it off PREDATE_PROVENANCE",
        "bench/out/gone.json: no Markdown file quotes it any more: take it off PREDATE_PROVENANCE",
    ]


def test_a_quoted_result_that_is_not_there_fails_even_when_listed(repo: Path) -> None:
    (repo / "bench" / "out" / "c.json").unlink()
    expected = ["bench/out/c.json: no such file; quoted in docs/results.md:3"]
    assert prov.check(repo, frozenset({"c.json"}), frozenset()) == expected


def test_an_output_not_run_yet_may_be_named_but_not_committed_unchecked(repo: Path) -> None:
    (repo / "bench" / "out" / "c.json").unlink()
    assert prov.check(repo, frozenset(), frozenset({"c.json"})) == []
    # Once committed it is checked like any result, and must leave the list.
    (repo / "bench" / "out" / "c.json").write_text("[]")
    assert prov.check(repo, frozenset(), frozenset({"c.json"})) == [
        "bench/out/c.json: committed now: take it off NOT_RUN_YET",
        "bench/out/c.json: not a JSON object; quoted in docs/results.md:3",
    ]
    (repo / "bench" / "out" / "c.json").write_text(json.dumps(GOOD))
    assert prov.check(repo, frozenset(), frozenset({"never.json"})) == [
        "bench/out/never.json: no Markdown file names it any more: take it off NOT_RUN_YET"
    ]


def test_the_repository_passes() -> None:
    assert prov.main(["check_bench_provenance.py", str(ROOT)]) == 0
