"""Where a benchmark result came from (polycorn_harness.provenance), on a temporary git
repository: clean, modified, staged, untracked, a change under bench/out or docs/img, the
refusal and its override, HEAD moving during a run, a run resumed from its fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polycorn_harness import provenance as pv

NO_ENV: dict[str, str] = {}
ALLOW = {pv.ALLOW_DIRTY: "1"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "bench" / "out").mkdir(parents=True)
    (r / "docs" / "img").mkdir(parents=True)
    (r / "code.py").write_text("x = 1\n")
    (r / "bench" / "out" / "old.json").write_text("{}\n")
    (r / "docs" / "img" / "plot.png").write_text("png\n")
    (r / ".gitignore").write_text("/scratch/\n")
    git(r, "init", "-q")
    commit_all(r, "first")
    return r


def test_a_clean_tree_gives_the_full_commit_and_clean(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    run = pv.start(repo / "bench" / "out" / "x.json", root=repo, environ=NO_ENV)
    assert run.fields() == run.started() == {"commit": head, "clean": True}
    assert len(head) == 40


def test_modified_staged_and_untracked_files_make_it_dirty(repo: Path) -> None:
    (repo / "code.py").write_text("x = 2\n")
    (repo / "staged.py").write_text("")
    git(repo, "add", "staged.py")
    (repo / "new").mkdir()
    (repo / "new" / "untracked.py").write_text("")
    state = pv.tree_state(repo)
    assert not state.clean
    assert state.dirty == ("code.py", "new/untracked.py", "staged.py")


def test_ignored_files_and_results_and_plots_leave_it_clean(repo: Path) -> None:
    (repo / "scratch").mkdir()
    (repo / "scratch" / "tmp").write_text("")  # git-ignored
    (repo / "bench" / "out" / "old.json").write_text('{"new": 1}\n')  # a result rewritten
    (repo / "bench" / "out" / "new.json").write_text("{}\n")  # a result not committed
    (repo / "docs" / "img" / "plot.png").unlink()
    (repo / "docs" / "img" / "hsr").mkdir()
    (repo / "docs" / "img" / "hsr" / "new.png").write_text("")
    assert pv.tree_state(repo).clean


def test_a_rename_counts_both_paths() -> None:
    assert pv.dirty_paths("R  docs/new.md\0bench/out/old.json\0?? bench/out/x.json\0") == (
        "docs/new.md",
    )
    assert pv.dirty_paths("R  bench/out/new.json\0code.py\0") == ("code.py",)


def test_a_dirty_tree_is_refused_for_bench_out_only(repo: Path) -> None:
    (repo / "code.py").write_text("x = 2\n")
    for out in (repo / "bench" / "out", repo / "bench" / "out" / "x.json"):
        with pytest.raises(pv.DirtyTree) as e:
            pv.start(out, root=repo, environ=NO_ENV)
        assert e.value.code == (
            f"{out}: the working tree has uncommitted changes: code.py; commit them, or "
            "set POLYCORN_BENCH_ALLOW_DIRTY=1 to write a result marked clean: false"
        )
    elsewhere = pv.start(repo / "elsewhere" / "x.json", root=repo, environ=NO_ENV)
    fields = elsewhere.fields()
    assert fields["clean"] is False
    assert fields["dirty_paths"] == ["code.py"] and fields["dirty_allowed"] is True


def test_the_override_writes_a_result_marked_not_clean(repo: Path) -> None:
    (repo / "code.py").write_text("x = 2\n")
    run = pv.start(repo / "bench" / "out" / "x.json", root=repo, environ=ALLOW)
    doc = run.stamp({"commit": "abc", "value": 1})
    head = git(repo, "rev-parse", "HEAD").strip()
    assert doc == {
        "commit": head,
        "clean": False,
        "dirty_paths": ["code.py"],
        "dirty_allowed": True,
        "value": 1,
    }
    assert list(doc)[:2] == ["commit", "clean"]


def test_dirty_paths_are_capped(repo: Path) -> None:
    for i in range(pv.MAX_PATHS + 10):
        (repo / f"f{i:03}.py").write_text("")
    fields = pv.start(repo / "x.json", root=repo, environ=NO_ENV).fields()
    assert len(fields["dirty_paths"]) == pv.MAX_PATHS


def test_a_tree_made_dirty_during_the_run_is_recorded(repo: Path) -> None:
    run = pv.start(repo / "bench" / "out", root=repo, environ=NO_ENV)
    (repo / "code.py").write_text("x = 2\n")
    fields = run.fields()
    assert fields["clean"] is False and fields["dirty_paths"] == ["code.py"]
    assert "commit_at_end" not in fields
    assert run.started()["clean"] is True  # what a later process resumes from


def test_head_moved_during_the_run_keeps_the_start_commit(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD").strip()
    run = pv.start(repo / "bench" / "out", root=repo, environ=NO_ENV)
    (repo / "code.py").write_text("x = 2\n")
    second = commit_all(repo, "second")
    assert pv.tree_state(repo).clean
    assert run.fields() == {
        "commit": first,
        "clean": False,
        "dirty_paths": [],
        "dirty_allowed": True,
        "commit_at_end": second,
    }


def test_a_resumed_run_is_refused_when_head_moved_since_its_start(repo: Path) -> None:
    recorded = pv.start(repo / "bench" / "out", root=repo, environ=NO_ENV).fields()
    out = repo / "bench" / "out" / "hsr.json"
    assert pv.resume(recorded, out, root=repo, environ=NO_ENV).fields()["clean"] is True
    (repo / "code.py").write_text("x = 2\n")
    commit_all(repo, "second")
    with pytest.raises(pv.DirtyTree) as e:
        pv.resume(recorded, out, root=repo, environ=NO_ENV)
    head = git(repo, "rev-parse", "HEAD").strip()
    assert e.value.code == (
        f"{out}: the run started at commit {recorded['commit']}, HEAD is {head}; run it again "
        "from one clean commit, or set POLYCORN_BENCH_ALLOW_DIRTY=1 to write a result marked "
        "clean: false"
    )
    # Handed over by the driver that started it: written, and says so.
    fields = pv.resume(recorded, out, root=repo, environ=ALLOW).fields()
    assert fields["clean"] is False and fields["commit"] == recorded["commit"]
    assert fields["commit_at_end"] != recorded["commit"]


def test_a_start_that_recorded_no_clean_is_not_clean(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    assert pv.Run.from_fields({"commit": head}, repo).fields()["clean"] is False
    with pytest.raises(pv.DirtyTree, match="started from a tree that was not clean"):
        pv.resume({"commit": head}, repo / "bench" / "out", root=repo, environ=NO_ENV)


def test_outside_a_git_checkout_nothing_is_clean(tmp_path: Path) -> None:
    run = pv.start(tmp_path / "x.json", root=tmp_path, environ=NO_ENV)
    assert run.fields()["commit"] is None and run.fields()["clean"] is False
    with pytest.raises(pv.DirtyTree, match="not a git checkout"):
        pv.start(tmp_path / "bench" / "out", root=tmp_path, environ=NO_ENV)


def test_the_shell_check_prints_the_start_a_later_step_goes_on_from(repo: Path) -> None:
    script = Path(pv.__file__)
    out = str(repo / "bench" / "out" / "x.json")
    r = subprocess.run(
        [sys.executable, str(script), "start", out], capture_output=True, text=True, check=True
    )
    printed = json.loads(r.stdout)
    assert printed["commit"] == pv.tree_state(pv.ROOT).commit
    # A later process of the same run: it goes on from the printed start, unchecked.
    env = {pv.START: json.dumps({"commit": "c" * 40, "clean": True})}
    run = pv.start(out, root=repo, environ=env)
    assert run.start == pv.TreeState("c" * 40, (), clean=True)
    assert run.fields()["commit_at_end"] == git(repo, "rev-parse", "HEAD").strip()


def test_markdown_states_commit_and_clean() -> None:
    assert pv.describe({"commit": "a" * 40, "clean": True}) == (
        f"Commit `{'a' * 40}`, clean working tree."
    )
    assert pv.describe(
        {"commit": "abc", "clean": False, "dirty_paths": ["x.py"], "commit_at_end": "def"}
    ) == ("Commit `abc`, **not clean** (uncommitted changes: x.py); HEAD was `def` at the end.")
    assert "not recorded" in pv.describe({"commit": "abc"})
