#!/usr/bin/env python3
"""Runs the honggfuzz targets of fuzz/ and summarises them as JSON.

Builds the instrumented targets once (`cargo hfuzz build`), then runs each
for --seconds on one thread, starting from its committed corpus
(fuzz/corpus/TARGET, never written: new inputs go to the run's workspace).
From honggfuzz's final "Summary" log line and its stats file it writes
{TARGET: {"execs", "seconds", "crashes", "edges", "guards",
"branch_coverage_percent", "new_units"}} to --json, after the commit and whether
the tree was clean ("commit", "clean", ...: polycorn_harness.provenance, which
refuses a --json in bench/out from a tree with uncommitted changes). A crashing input is
copied next to the corpus as crash-* (git-ignored) and honggfuzz's report is
printed; the exit status is 1 if any target crashed.

`cargo hfuzz` comes from scripts/setup.d/fuzz.sh (`setup.sh fuzz`).
"""

# ruff: noqa: S603, S607  (runs cargo hfuzz, found on PATH like every tool here)
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
# The harness's provenance helper, standard library only like this script.
sys.path.insert(0, str(ROOT / "testbed" / "harness"))
from polycorn_harness import provenance  # noqa: E402

TARGETS = [
    "frame_decoder",
    "endpoint_relay",
    "endpoint_proxy",
    "telemetry_record",
    "failure_table",
    "socks5",
    "dns",
    "gpsd",
    "mmcli",
]
SUMMARY = re.compile(
    r"Summary iterations:(\d+) time:(\d+) speed:\d+ crashes_count:(\d+) "
    r".*?new_units_added:(\d+) .*?guard_nb:(\d+) branch_coverage_percent:(\d+)"
)


def hfuzz_env(target_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    version = re.search(
        r"^HONGGFUZZ_VERSION=(\S+)", (ROOT / "scripts/setup.d/fuzz.sh").read_text(), re.M
    )
    if not version:
        sys.exit("fuzz: HONGGFUZZ_VERSION not found in scripts/setup.d/fuzz.sh")
    cache = os.environ.get("POLYCORN_CACHE", "/var/cache/polycorn")
    env["PATH"] = f"{cache}/cargo-hfuzz-{version.group(1)}/bin:{env.get('PATH', '')}"
    env["CARGO_TARGET_DIR"] = str(target_dir)
    # cargo hfuzz builds incrementally, which a compiler cache (the
    # Makefile's sccache) refuses to wrap; its instrumented build shares
    # nothing with another build anyway.
    env["RUSTC_WRAPPER"] = ""
    return env


def run_target(target: str, seconds: int, env: dict[str, str], work: Path) -> dict[str, int]:
    ws = work / target
    shutil.rmtree(ws, ignore_errors=True)
    (ws / "new").mkdir(parents=True)
    log, stats = ws / "honggfuzz.log", ws / "stats.csv"
    run_env = dict(env)
    run_env["HFUZZ_WORKSPACE"] = str(work / "ws")
    run_env["HFUZZ_INPUT"] = str(FUZZ / "corpus" / target)
    run_env["HFUZZ_RUN_ARGS"] = (
        f"--run_time {seconds} --threads 1 --verbose --exit_upon_crash --timeout 10 "
        f"--output {ws / 'new'} --logfile {log} --statsfile {stats}"
    )
    crash_dir = work / "ws" / target
    shutil.rmtree(crash_dir, ignore_errors=True)
    subprocess.run(
        ["cargo", "hfuzz", "run", target],
        cwd=FUZZ,
        env=run_env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    m = SUMMARY.search(log.read_text(errors="replace"))
    if not m:
        sys.exit(f"fuzz: no Summary line in {log}")
    execs, secs, crashes, new_units, guards, branch = (int(x) for x in m.groups())
    edges = 0
    rows = (
        [r for r in stats.read_text().splitlines() if r and not r.startswith("#")]
        if stats.exists()
        else []
    )
    if rows:
        edges = int(rows[-1].split(",")[7])
    found = sorted(p for p in crash_dir.glob("*.fuzz") if p.is_file()) if crash_dir.exists() else []
    for p in found:
        dest = FUZZ / "corpus" / target / f"crash-{p.name}"
        shutil.copyfile(p, dest)
        print(f"fuzz: {target}: crashing input saved as {dest.relative_to(ROOT)}", file=sys.stderr)
    report = crash_dir / "HONGGFUZZ.REPORT.TXT"
    if found and report.exists():
        print(report.read_text(errors="replace"), file=sys.stderr)
    return {
        "execs": execs,
        "seconds": secs,
        "crashes": max(crashes, len(found)),
        "edges": edges,
        "guards": guards,
        "branch_coverage_percent": branch,
        "new_units": new_units,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=300, help="run time per target")
    ap.add_argument("--json", type=Path, help="where to write the summary")
    ap.add_argument(
        "--target-dir",
        type=Path,
        default=Path(os.environ.get("FUZZ_TARGET_DIR", FUZZ / "hfuzz_target")),
        help="cargo hfuzz's build directory (default $FUZZ_TARGET_DIR or fuzz/hfuzz_target)",
    )
    ap.add_argument(
        "--work", type=Path, default=FUZZ / "hfuzz_workspace", help="workspaces, logs, new inputs"
    )
    ap.add_argument("targets", nargs="*", default=TARGETS)
    args = ap.parse_args()
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        sys.exit(f"fuzz: unknown targets {sorted(unknown)} (have {TARGETS})")
    prov = provenance.start(*([args.json] if args.json else []))
    env = hfuzz_env(args.target_dir)
    subprocess.run(["cargo", "hfuzz", "build"], cwd=FUZZ, env=env, check=True)
    results: dict[str, dict[str, int]] = {}
    for t in args.targets:
        r = run_target(t, args.seconds, env, args.work)
        results[t] = r
        print(
            f"fuzz: {t}: {r['execs']} execs in {r['seconds']} s, {r['edges']} edges "
            f"({r['branch_coverage_percent']} % of {r['guards']} guards), "
            f"{r['new_units']} new inputs, {r['crashes']} crashes",
            flush=True,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        by_target = {t: dict(sorted(r.items())) for t, r in sorted(results.items())}
        args.json.write_text(json.dumps(prov.stamp(by_target), indent=2) + "\n")
    crashed = [t for t, r in results.items() if r["crashes"]]
    if crashed:
        print(f"fuzz: crashes in {crashed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
