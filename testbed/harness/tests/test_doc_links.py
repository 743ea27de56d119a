"""The Markdown link check of the static stage (scripts/check_doc_links.py): a dead file or
heading is found, a live one and anything in code is not."""

from __future__ import annotations

import subprocess
from pathlib import Path

from script_loader import load_script

from polycorn_harness import ROOT

links = load_script("doc_links", "scripts/check_doc_links.py")


def test_github_anchors() -> None:
    assert links.slug("The default pipeline against `minrtt` and the paper") == (
        "the-default-pipeline-against-minrtt-and-the-paper"
    )
    assert links.slug("Recovery after failed handovers, n ≥ 60 (`recovery`)") == (
        "recovery-after-failed-handovers-n--60-recovery"
    )


def test_dead_links_are_found_and_live_ones_pass(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(
        "# A\n\n## Twice\n\n## Twice\n\n"
        "[ok](b.md#the-heading) [ok](#twice-1) [ok](../README.md) `[code](gone.md)`\n"
        "```\n[fenced](gone.md)\n```\n"
        "[dead file](gone.md)\n[dead heading](b.md#no-such-heading)\n[dead](#twice-2)\n",
        encoding="utf-8",
    )
    (docs / "b.md").write_text("# B\n\n## The heading\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("[web](https://example.org/x.md)\n", encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    problems = [
        p for rel in links.markdown_files(tmp_path) for p in links.check_file(tmp_path, rel)
    ]
    assert problems == [
        "docs/a.md:11: gone.md: no such file",
        "docs/a.md:12: b.md#no-such-heading: no heading #no-such-heading in b.md",
        "docs/a.md:13: #twice-2: no heading #twice-2 in a.md",
    ]


def test_the_repository_has_no_dead_link() -> None:
    assert links.main(["check_doc_links.py", str(ROOT)]) == 0
