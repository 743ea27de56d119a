#!/usr/bin/env python3
"""Fits the loss around handovers (polycorn-tracegen's ``handover_loss``) to hsr-facts §15.8
item 12 on development trips: for each candidate setting, generates the development trips with
``--set handover_loss.KEY=VALUE`` and measures item 12 exactly as ``make validate-tracegen``
does (one BBR ``iperf3 -R`` flow per trip and carrier through polycorn-emu, the same counters and
definitions), all settings at once. Prints one line per setting and carrier and writes the
results as JSON.

    sudo uv run --all-packages --locked python scripts/fit_handover_loss.py \\
        --setting none --setting before_ms=150,after_ms=150 --out /tmp/fit.json

A setting ``none`` runs the preset as it is (no preset has loss around handovers); any other
starts from the generator's ``HandoverLoss::DEFAULT`` (70 %, 150 ms on each side).
Development trips only (route 1, trips 1-2 by default): the validation's held-out routes
(scripts/validate_tracegen.py, HELD_OUT_ROUTES) must never be used to fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_tracegen as vt

DEV_ROUTE = 1
DEV_TRIPS = (1, 2)


def _setting_args(setting: str, preset: str) -> tuple[str, list[str]]:
    """(preset, --set arguments) of one setting: ``none`` or ``key=value,key=value``."""
    if setting == "none":
        return preset, []
    args: list[str] = []
    for kv in setting.split(","):
        if "=" not in kv:
            raise SystemExit(f"setting {setting!r}: expected none or KEY=VALUE[,KEY=VALUE]")
        args += ["--set", f"handover_loss.{kv}"]
    return preset, args


def generate(
    b: vt.Build, preset: str, sets: Sequence[str], *, trips: Sequence[int], seconds: int, work: Path
) -> list[Path]:
    dirs = []
    for t in trips:
        d = work / f"r{DEV_ROUTE}-t{t}"
        cmd: list[str | Path] = [b.binaries["polycorn-tracegen"], "generate", "--preset", preset]
        cmd += ["--route-seed", str(DEV_ROUTE), "--trip-seed", str(t)]
        cmd += ["--duration-s", str(seconds + 10), "--carriers", "2", "--out", d, *sets]
        vt._run(cmd)
        dirs.append(d)
    return dirs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", action="append", required=True, help="none | KEY=VALUE,...")
    ap.add_argument("--preset", default=vt.DEFAULT_PRESET)
    ap.add_argument("--trips", type=int, nargs="+", default=list(DEV_TRIPS))
    ap.add_argument("--seconds", type=int, default=300)
    work = Path(tempfile.gettempdir()) / "polycorn-fit-handover-loss"
    ap.add_argument("--work", type=Path, default=work)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    b = vt.build(args.work)
    cc = vt._congestion_control()
    results = []
    # One plan per setting, all started before any is awaited: tcp_runs waits for its own runs,
    # so the settings run one after the other unless their runs share one call. They do:
    # every setting's trips go into one list and one plan with distinct prefixes.
    dirs: list[Path] = []
    owners: list[str] = []
    for k, setting in enumerate(args.setting):
        preset, sets = _setting_args(setting, args.preset)
        ds = generate(
            b, preset, sets, trips=args.trips, seconds=args.seconds, work=args.work / f"s{k}"
        )
        dirs += ds
        owners += [setting] * len(ds)
    plan = vt.TcpPlan(trips=len(dirs), seconds=args.seconds, prefix="pcf")
    vt.tcp_runs(b, dirs, plan, args.work)
    runs_by_setting: dict[str, list[vt.TcpRun]] = {}
    for ti, (d, owner) in enumerate(zip(dirs, owners, strict=True), 1):
        for c in (0, 1):
            r = vt.TcpRun(f"{plan.prefix}{ti}c{c}", c, d, None, Path())  # type: ignore[arg-type]
            runs_by_setting.setdefault(owner, []).append(r)
    for setting in args.setting:
        s = vt.summarize_tcp(args.work / "tcp", runs_by_setting[setting], args.seconds, cc)
        results.append({"setting": setting, "item12": s})
        for label in ("A", "B"):
            x = s.get(label, {})
            nan = float("nan")
            print(
                f"{setting:>32} {label}: RTO share {x.get('rto_share', nan):.3f} %  "
                f"multi-RTO {x.get('multi_rto') or nan:.1f} %  "
                f"episodes {x.get('episodes')}  goodput {x.get('goodput_mbps', nan):.2f} Mbit/s"
            )
    doc = {
        "preset": args.preset,
        "route": DEV_ROUTE,
        "trips": args.trips,
        "seconds": args.seconds,
        "cc": cc,
        "published": {"rto_share": 1.8, "multi_rto": 24.0},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
