"""Does every relative link in the repository's Markdown lead somewhere?

    check_doc_links.py [ROOT]

For every Markdown file git knows in ROOT (default: this repository), each
inline link ``[text](target)`` whose target is not a URL is resolved from the
file's directory: the file or folder must exist, and a ``#fragment`` on a
Markdown file must name one of its headings, as GitHub spells heading
anchors (lower case; punctuation other than ``-`` and ``_`` dropped; spaces
become ``-``; a repeated heading gets ``-1``, ``-2``, ...). A link to a
fragment alone names a heading of the same file. Fenced code blocks and
inline code are skipped.

Pages move and headings get reworded; a reader who follows a dead link from
the README has nowhere to go, so the static stage fails on one. Exits 1 if
anything is found (``file:line: why``), 0 otherwise.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

from check_self_contained import git_files

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered from 1."""
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        seen.setdefault(base if k == 0 else f"{base}-{k}", 1)
    return frozenset(seen)


def check_file(root: Path, rel: str) -> list[str]:
    path = root / rel
    problems: list[str] = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        stripped = INLINE_CODE.sub("", line)
        for target in [*LINK.findall(stripped), *IMAGE.findall(stripped)]:
            if EXTERNAL.match(target) or target.startswith("<"):
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{rel}:{n}: {target}: no such file")
                continue
            if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problems.append(f"{rel}:{n}: {target}: no heading #{fragment} in {dest.name}")
    return problems


def markdown_files(root: Path) -> list[str]:
    """The Markdown files git knows, as :mod:`check_self_contained` lists a tree."""
    return [p for p in git_files(root) if p.endswith(".md") and (root / p).is_file()]


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    problems = [p for rel in markdown_files(root) for p in check_file(root, rel)]
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} dead link(s) in the Markdown", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
