"""Did ``cargo test -- --ignored`` run exactly the expected tests, and pass them all?

    cargo_ignored_tests.py LOG --status RC --expect BINARY::TEST_PATH...

LOG is the output of ``cargo test --workspace --no-fail-fast -- --ignored``
(cargo's and libtest's, 2>&1), RC cargo's exit status. With ``--ignored``
libtest runs only the ``#[ignore]`` tests, so every ``test NAME ... RESULT``
line of LOG is one of them. A test is named by the test binary that ran it
(``Running unittests src/main.rs (target/release/deps/polycorn_proxy-1a2b)``
gives ``polycorn_proxy``; doc tests ``doc:<crate>``) and libtest's path,
joined by ``::``: ``polycorn_proxy::kafka::tests::broker::records_reach_kafka``.

Every expected test must have run and passed (``ok``); a test that ran but is
not expected fails the check too, so that a new ``#[ignore]`` test must be
added to the caller's list (``IGNORED_TESTS`` of
testbed/harness/suites/telemetry/test_fleet_telemetry.py) and cannot be
skipped silently. A non-zero RC with every test passing (a build error in a
crate without ignored tests, a crashed test binary) fails as well. Prints one
line per test and every problem; exits 1 on any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

RUNNING = re.compile(
    r"^\s*Running (?:unittests )?\S+ \((?:.*/)?([^/()]+?)(?:-[0-9a-f]{8,})?(?:\.exe)?\)\s*$"
)
DOCTESTS = re.compile(r"^\s*Doc-tests (\S+)\s*$")
RESULT = re.compile(r"^test (.+?) \.\.\. (ok|FAILED|ignored(?:, .*)?)$")


def results(log: str) -> tuple[dict[str, str], list[str]]:
    """Each test's result, and the lines that say something broke."""
    got: dict[str, str] = {}
    trouble: list[str] = []
    binary = "?"
    for line in log.splitlines():
        if m := RUNNING.match(line):
            binary = m.group(1)
        elif m := DOCTESTS.match(line):
            binary = f"doc:{m.group(1)}"
        elif m := RESULT.match(line):
            got[f"{binary}::{m.group(1)}"] = m.group(2)
        elif re.match(r"^error(\[E\d+\])?:", line) or "panicked at" in line:
            trouble.append(line.strip())
    return got, trouble


def check(log: str, status: int, expect: list[str]) -> list[str]:
    got, trouble = results(log)
    problems: list[str] = []
    for name, res in sorted(got.items()):
        print(f"  {name} ... {res}")
    for name in expect:
        if name not in got:
            problems.append(f"expected ignored test did not run: {name}")
        elif got[name] != "ok":
            problems.append(f"ignored test {got[name]}: {name}")
    for name in sorted(set(got) - set(expect)):
        problems.append(
            f"unexpected ignored test ran ({got[name]}): {name} "
            "(add it to IGNORED_TESTS in testbed/harness/suites/telemetry/test_fleet_telemetry.py)"
        )
    if status != 0 and not problems:
        problems.append(f"cargo test exited {status} although every expected test passed")
    if problems:
        problems += [f"log: {t}" for t in trouble[:10]]
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log", type=Path)
    p.add_argument("--status", type=int, required=True, help="cargo test's exit status")
    p.add_argument("--expect", nargs="+", required=True, metavar="BINARY::TEST_PATH")
    a = p.parse_args(argv)
    if len(set(a.expect)) != len(a.expect):
        print("cargo_ignored_tests: --expect names a test twice", file=sys.stderr)
        return 2
    problems = check(a.log.read_text(errors="replace"), a.status, a.expect)
    for line in problems:
        print(f"  FINDING {line}")
    print(f"cargo_ignored_tests: {len(a.expect)} expected, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
