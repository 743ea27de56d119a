"""The stage runner of make test, make check and make test-deep
(scripts/test_stages.py): its plans keep every check, and a failing stage
stops the plan, its neighbours and nothing else."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
from script_loader import load_script

stages = load_script("stage_runner", "scripts/test_stages.py")

#: What make test must run, as a piece of some stage's command: the checks
#: that CI relies on. Dropping one from the plan fails this test.
MAKE_TEST_RUNS = [
    "scripts/setup.sh",
    "check_self_contained.py",
    "check_bench_provenance.py",
    "fmt --all --check",
    "check_features.py",
    "clippy --release --workspace --all-targets",
    "build --release --workspace --all-targets",
    "test --release --workspace",
    "fuzz-smoke",
    "lint-py",
    "test-py-bench",
    "PY_TESTS=ingest/tests",
    "PY_TESTS=bench/run/tests",
    "PY_TESTS_SKIP='ingest/tests bench/run/tests'",
    "buildcache",
    "test-compose.sh --build-only",
    "validate-platform",
    "validate-tracegen VAL_PROFILE=ci",
    "scripts/integration.sh",
    "scripts/integration-hsr.sh",
    "scripts/integration-telemetry.sh",
    "chaos-smoke",
    "scripts/test-first-start.sh",
    "scripts/test-compose.sh",
]


def _commands(plan: str) -> list[str]:
    return [st.command for step in stages.PLANS[plan] for st in step]


@pytest.mark.parametrize("piece", MAKE_TEST_RUNS)
def test_make_test_runs_every_check(piece: str) -> None:
    assert any(piece in c for c in _commands("test")), piece


@pytest.mark.parametrize("plan", sorted(stages.PLANS))
def test_a_plans_stage_names_are_unique_and_it_starts_with_setup(plan: str) -> None:
    names = [st.name for step in stages.PLANS[plan] for st in step]
    assert len(names) == len(set(names)), names
    (first,) = stages.PLANS[plan][0]
    assert first.name == "setup" and first.command.startswith("bash scripts/setup.sh")


def test_make_check_runs_the_static_checks_and_the_unit_and_python_tests() -> None:
    for piece in (
        "check_features.py",
        "check_bench_provenance.py",
        "clippy",
        "test --release --workspace",
        "lint-py",
        "test-py-bench",
        "PY_TESTS=ingest/tests",
        "PY_TESTS=bench/run/tests",
        "PY_TESTS_SKIP='ingest/tests bench/run/tests'",
    ):
        assert any(piece in c for c in _commands("check")), piece


@pytest.mark.parametrize("plan", ["test", "check"])
def test_the_python_test_parts_run_every_package_once(plan: str) -> None:
    """Each part but one names its PY_TESTS; that one skips exactly those."""
    cmds = [c for c in _commands(plan) if "make --no-print-directory test-py-services" in c]
    parts = [shlex.split(c.split("PY_TESTS=", 1)[1])[0] for c in cmds if "PY_TESTS=" in c]
    (rest,) = [c for c in cmds if "PY_TESTS_SKIP=" in c]
    skipped = shlex.split(rest.split("PY_TESTS_SKIP=", 1)[1])[0].split()
    assert sorted(parts) == sorted(skipped), (parts, skipped)


def test_make_test_deep_goes_deeper() -> None:
    deep = _commands("deep")
    assert any("POLYCORN_TEST_DEPTH" in c and "test --release --workspace" in c for c in deep)
    assert any("POLYCORN_TEST_DEPTH" in c and "integration-hsr" in c for c in deep)
    assert any("POLYCORN_TEST_DEPTH" in c and "integration-telemetry" in c for c in deep)
    assert any("FUZZ_SMOKE_SECONDS" in c for c in deep)


@pytest.fixture(autouse=True)
def _logs_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stages' logs in the test's directory, not in target/test-logs."""
    monkeypatch.setattr(stages, "LOGS", tmp_path / "logs")


def _run(step: tuple[object, ...]) -> tuple[bool, dict[str, object]]:
    results = {st.name: stages.Result(st.name) for st in step}  # type: ignore[attr-defined]
    ok = stages.Runner().run_step(step, time.monotonic(), results)
    return ok, results


def test_a_failing_stage_stops_its_neighbours_who_tear_down() -> None:
    step = (
        stages.Stage("fails", "sleep 0.3; exit 3"),
        stages.Stage("slow", "trap 'echo tore down; exit 130' INT; sleep 60 & wait"),
        stages.Stage("quick", "true"),
    )
    ok, results = _run(step)
    assert not ok
    got = {n: r.status for n, r in results.items()}  # type: ignore[attr-defined]
    assert got == {"fails": "failed", "slow": "stopped", "quick": "ok"}
    assert results["slow"].seconds < 30  # type: ignore[attr-defined]
    assert "tore down" in (stages.LOGS / "slow.log").read_text()


def test_a_stage_alone_keeps_its_log_unprefixed(capfd: pytest.CaptureFixture[str]) -> None:
    ok, _ = _run((stages.Stage("alone", "echo one; echo two >&2; exit 1"),))
    assert not ok
    assert (stages.LOGS / "alone.log").read_text().splitlines() == ["one", "two"]
    assert "one\ntwo\n" in capfd.readouterr().out


def test_stages_that_pass_pass_the_step() -> None:
    ok, results = _run((stages.Stage("a", "true"), stages.Stage("b", "echo b")))
    assert ok
    assert all(r.status == "ok" for r in results.values())  # type: ignore[attr-defined]


def test_the_times_file_has_every_stage_also_those_not_run(tmp_path: Path) -> None:
    rs = [stages.Result("a", "ok", 0.0, 1.5), stages.Result("b", "failed", 1.5, 2.0)]
    rs.append(stages.Result("c"))
    out = tmp_path / "times.json"
    stages.report("test", rs, 3.5, False, out)
    doc = json.loads(out.read_text())
    assert doc["total_seconds"] == 3.5 and doc["ok"] is False and doc["plan"] == "test"
    assert [(s["name"], s["seconds"], s["status"]) for s in doc["stages"]] == [
        ("a", 1.5, "ok"),
        ("b", 2.0, "failed"),
        ("c", 0.0, "not run"),
    ]
    assert len(doc["commit"]) == 40 or doc["commit"] == "unknown"


def test_only_and_skip_select_stages_and_refuse_unknown_names() -> None:
    plan = stages.PLANS["test"]
    only = stages.select(plan, {"clippy", "lint-py"}, set())
    assert [[st.name for st in step] for step in only] == [["clippy"], ["lint-py"]]
    skipped = [st.name for step in stages.select(plan, set(), {"compose"}) for st in step]
    assert "compose" not in skipped and "setup" in skipped
    with pytest.raises(SystemExit, match="no stage named nope"):
        stages.select(plan, {"nope"}, set())


def test_a_failed_stage_names_its_failing_tests_after_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stages, "LOGS", tmp_path / "logs")
    stages.LOGS.mkdir()
    noise = [f"collected line {i}" for i in range(200)]
    (stages.LOGS / "py.log").write_text(
        "\n".join(
            [
                *noise[:100],
                "FAILED tests/test_x.py::test_slow_drain - assert 6.1 < 5",
                *noise[100:],
                "1 failed, 99 passed in 30.0s",
            ]
        )
    )
    (stages.LOGS / "fine.log").write_text("FAILED in a stage that passed\n")
    rs = [stages.Result("fine", "ok", 0.0, 1.0), stages.Result("py", "failed", 1.0, 30.0)]
    stages.report("test", rs, 31.0, False, tmp_path / "times.json")
    out = capsys.readouterr().out
    after_table = out.split("stage times:", 1)[1]
    assert "=== py failed" in after_table
    assert "FAILED tests/test_x.py::test_slow_drain - assert 6.1 < 5" in after_table
    assert "1 failed, 99 passed" in after_table
    assert "collected line 50" not in after_table
    assert "a stage that passed" not in out
    assert len(after_table.splitlines()) < stages.DIGEST_MATCHES + stages.DIGEST_TAIL + 5
