"""Does anything in the repository reference something outside it?

    check_self_contained.py [ROOT]

Scans every file git knows in ROOT (default: this repository): tracked files
and untracked ones that are not ignored. It reports, as ``file:line: why``:

- the design folder that sits next to some checkouts (``shared`` one level
  up: its notes, seeds and data) and absolute paths of a workstation
  (``/work/...``, ``/home/<user>/...``); a clone has neither;
- relative paths whose ``..`` steps leave the repository, resolved from the
  file's directory, and for Rust code from its crate's directory (where
  ``env!("CARGO_MANIFEST_DIR")`` and the test working directory point;
  ``include_str!`` and friends stay relative to the file); ``$(dirname ..)/..``
  forms resolve from the file's directory too, and ``$root/..`` always leaves;
- tracked symbolic links whose target is outside the repository;
- issue numbers (the word "issue" and a number): the repository links no tracker;
- design-note names (``hsr-facts``, ``brief.md``, ``style.md``, ``infra.md``)
  with no file of that name in the repository, and ``hsr-facts §N`` citations
  (with ``item K``) that the repository's hsr-facts.md has no section or item
  for.

Exits 1 if anything is found, 0 otherwise. Files that are not UTF-8 text are
skipped. ALLOWED lists the few known exceptions, each with its reason.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

HERE = PurePosixPath("scripts/check_self_contained.py")

#: (path, text the line contains, why it is fine).
ALLOWED: list[tuple[str, str, str]] = [
    # This file names the patterns it looks for.
    (str(HERE), "", "the checker's own patterns and documentation"),
]

#: Design notes that lived outside the repository, by the name they are cited with.
DESIGN_NOTES = ("hsr-facts", "brief", "style", "infra")

OUTSIDE = [
    (re.compile(r"(?<![\w.-])\.\./shared\b"), "the sibling 'shared' folder"),
    (
        re.compile(r"(?<![\w./-])shared/(?:design|seeds|data|hooks)\b"),
        "the sibling 'shared' folder",
    ),
    (re.compile(r"(?<![\w.-])/work/"), "an absolute path of a workstation"),
    # The repository links no issue tracker, so a number explains nothing to its reader: the
    # why belongs beside the code, the when in git.
    (re.compile(r"\b(?:issues?|PR) #?\d+\b", re.IGNORECASE), "an issue number of no tracker here"),
    (re.compile(r"(?<![\w.-])/home/[a-z_][\w-]*/"), "an absolute path of a home directory"),
    (
        re.compile(r"\$\{?(?:root|ROOT|REPO_ROOT|repo_root|repo|REPO)\}?/\.\.(?=/|\b|$)"),
        "a path above the repository root",
    ),
]
#: A run of `..` steps and what follows it (`../../x`, `../..`).
DOTDOT = re.compile(r"(?<![\w.$})/])((?:\.\./)*\.\.)(?=/|[\s\"'`),;:]|$)((?:/[\w.@+-]+)*)")
#: `$(dirname "$0")/..` and `$(dirname "${BASH_SOURCE[0]}")/..`: from the file's directory.
DIRNAME = re.compile(r"\$\(dirname [^)]*\)((?:/\.\.)+)")
INCLUDE = re.compile(r"\binclude(?:_str|_bytes)?!\s*\(|#\[path\s*=")
NOTE = re.compile(r"(?<![\w/.-])(hsr-facts)(?:\.md)?\b|(?<![\w/.-])(brief|style|infra)\.md\b")
CITATION = re.compile(
    r"hsr-facts(?:\.md)?`?\)?\s*§\s?(\d+(?:\.\d+)*[a-z]?)"
    r"(?:\s*[–-]\s*§?\s?(\d+(?:\.\d+)*[a-z]?))?"
    r"(?:\s+items?\s+(\d+))?"
)
HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*[a-z]?)\.?\s")
LIST_ITEM = re.compile(r"^(\d+)\.\s")


def git_files(root: Path) -> list[str]:
    # A fixed git command; only the directory comes from the caller.
    out = subprocess.run(  # noqa: S603
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],  # noqa: S607
        check=True,
        capture_output=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def allowed(path: str, line: str) -> bool:
    return any(path == p and text in line for p, text, _ in ALLOWED)


def escapes(base: PurePosixPath, steps: int) -> bool:
    """Whether `steps` times `..` from `base` (relative to the root) leaves the root."""
    return steps > len(base.parts)


def crate_dir(path: PurePosixPath, files: set[str]) -> PurePosixPath:
    for d in path.parents:
        if str(d / "Cargo.toml") in files or (d == PurePosixPath(".") and "Cargo.toml" in files):
            return d
    return path.parent


def sections(doc: str) -> tuple[set[str], dict[str, set[str]]]:
    """Section numbers of a markdown page, and the numbered list items in each."""
    found: set[str] = set()
    items: dict[str, set[str]] = {}
    current = ""
    for line in doc.splitlines():
        if h := HEADING.match(line):
            current = h.group(1)
            found.add(current)
        elif (i := LIST_ITEM.match(line)) and current:
            items.setdefault(current, set()).add(i.group(1))
    return found, items


def check_line(
    path: PurePosixPath,
    line: str,
    files: set[str],
    names: dict[str, str],
    facts: tuple[set[str], dict[str, set[str]]] | None,
) -> list[str]:
    return path_problems(path, line, files) + note_problems(line, names, facts)


def path_problems(path: PurePosixPath, line: str, files: set[str]) -> list[str]:
    """Paths in one line of ``path`` that lead outside the repository."""
    problems: list[str] = []
    for pattern, why in OUTSIDE:
        for m in pattern.finditer(line):
            problems.append(f"{why}: {m.group(0)!r}")
    rust = path.suffix == ".rs" and not INCLUDE.search(line)
    base = crate_dir(path, files) if rust else path.parent
    for m in DOTDOT.finditer(line):
        steps = m.group(1).count("..")
        if escapes(base, steps):
            problems.append(f"{m.group(0)!r} from {base}/ leaves the repository")
    for m in DIRNAME.finditer(line):
        if escapes(path.parent, m.group(1).count("..")):
            problems.append(f"{m.group(0)!r} leaves the repository")
    return problems


def note_problems(
    line: str, names: dict[str, str], facts: tuple[set[str], dict[str, set[str]]] | None
) -> list[str]:
    """Design notes one line cites that the repository lacks, and hsr-facts sections
    and items that its hsr-facts.md does not have."""
    problems: list[str] = []
    for m in NOTE.finditer(line):
        name = (m.group(1) or m.group(2)) + ".md"
        if name not in names:
            problems.append(f"cites {name}, which is not in the repository")
    if facts is None:
        return problems
    found, items = facts
    for m in CITATION.finditer(line):
        for sec in (m.group(1), m.group(2)):
            if sec and sec not in found:
                problems.append(f"hsr-facts §{sec}: no such section in {names['hsr-facts.md']}")
        item = m.group(3)
        sec = m.group(1)
        if item and f"{sec}.{item}" not in found and item not in items.get(sec, set()):
            problems.append(f"hsr-facts §{sec} item {item}: no such item")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    root = root.resolve()
    paths = git_files(root)
    files = set(paths)
    names: dict[str, str] = {}
    for p in paths:
        names.setdefault(PurePosixPath(p).name, p)
    facts = None
    if "hsr-facts.md" in names:
        facts = sections((root / names["hsr-facts.md"]).read_text(encoding="utf-8"))
    bad = 0
    for p in paths:
        path = PurePosixPath(p)
        full = root / p
        if full.is_symlink():
            target = (full.parent / full.readlink()).resolve()
            if not target.is_relative_to(root):
                print(f"{p}: symbolic link to {target}, outside the repository")
                bad += 1
            continue
        if not full.is_file():
            continue  # deleted in the work tree, or a submodule
        try:
            text = full.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if allowed(p, line):
                continue
            for problem in check_line(path, line, files, names, facts):
                print(f"{p}:{n}: {problem}")
                bad += 1
    if bad:
        print(f"check_self_contained: {bad} reference(s) outside the repository", file=sys.stderr)
        return 1
    print(f"check_self_contained: {len(paths)} files, nothing outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
