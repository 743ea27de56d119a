#!/usr/bin/env python3
"""Fits the loss around handovers (polycorn-tracegen's ``handover_loss``) to hsr-facts §15.8
item 12 on development trips: for each candidate setting, generates the development trips with
``--set handover_loss.KEY=VALUE`` and measures item 12 exactly as ``make validate-tracegen``
does (one BBR ``iperf3 -R`` flow per trip and carrier through polycorn-emu, the same counters and
definitions), all settings at once. Prints one line per setting and carrier and writes the
results as JSON.

    sudo uv run --all-packages --locked python testbed/tracegen/tools/fit_handover_loss.py \\
        --setting none --setting before_ms=150,after_ms=150 --out /tmp/fit.json

A setting ``none`` runs the preset as it is (no preset has loss around handovers); any other
starts from the generator's ``HandoverLoss::DEFAULT`` (70 %, 150 ms on each side).
Development trips only (route 1, trips 1-2 by default): the validation's held-out routes
(validate_tracegen.py, HELD_OUT_ROUTES) must never be used to fit.
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


def _set_args(setting: str) -> list[str]:
    """The ``--set`` arguments of one setting: ``none`` or ``key=value,key=value``."""
    if setting == "none":
        return []
    args: list[str] = []
    for kv in setting.split(","):
        if "=" not in kv:
            raise SystemExit(f"setting {setting!r}: expected none or KEY=VALUE[,KEY=VALUE]")
        args += ["--set", f"handover_loss.{kv}"]
    return args


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
    fleet = vt.Fleet(
        "dev",
        args.preset,
        tuple((DEV_ROUTE, t) for t in args.trips),
        "fitting the loss around handovers",
        duration_s=args.seconds + 10,
    )
    # Every setting's trips in one set of runs, so that all settings run at once.
    owner: dict[Path, str] = {}
    tracegen = b.binaries["polycorn-tracegen"]
    for k, setting in enumerate(args.setting):
        for d in vt.generate(tracegen, fleet, args.work / f"s{k}", _set_args(setting)):
            owner[d] = setting
    plan = vt.TcpPlan(trips=len(owner), seconds=args.seconds, prefix="pcf")
    runs, cc = vt.run_tcp(b, list(owner), plan, args.work)
    results = []
    for setting in args.setting:
        mine = [r for r in runs if owner[r.trip_dir] == setting]
        s = vt.summarize_tcp(args.work / "tcp", mine, args.seconds, cc)
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
