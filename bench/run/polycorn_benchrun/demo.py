"""The demo (make demo): one emulated high-speed-rail trip through the whole data
plane, then the fleet loop through the cloud side.

    python -m polycorn_benchrun.demo

First the scheme comparison: polycorn-tracegen generates a short trip (two carriers at
300 km/h, with handovers, failures and blackouts, hsr-facts §15); for every scheme a
copy of the topology is built (passengers -> relay-agent -> polycorn-emu replaying the
trip -> proxy -> nginx/IM origin), all replaying the trip in step; the same downloads
and instant messages run through each; the comparison table is printed; everything is
torn down (also on Ctrl-C). That is :mod:`polycorn_benchrun.hsr` on its demo profile:
results go under /tmp/polycorn-bench-hsr/out (never over the committed bench/out). By
default it runs the default pipeline hrsch+ and HRSCH (the paper's scheduler), with a
failure-location table built from previous trips, against the main baselines;
SCHEMES="minrtt blest" picks others (bench-hsr's list has them all). Its topologies
are hd0, hd1, ... (BENCH_PREFIX; a bench-hsr run uses hb0, ...), so both can run at
once.

Then the fleet part, :mod:`polycorn_benchrun.demo_fleet` (its docstring has its
variables). Needs root (network namespaces) and the release binaries (make build).
"""

from __future__ import annotations

import os
import sys

from polycorn_benchrun import demo_fleet, hsr

SCHEMES = "minrtt hrsch+ hrsch blest redundant single-path kernel-mptcp"

INTRO = """\
== Polycorn demo: an emulated HSR trip, the default pipeline (hrsch+: HRSCH, stale \
filter, tail rules), HRSCH and the baselines side by side
   passengers -> relay-agent -> 2 emulated carriers (trace replay, handovers) -> proxy -> origin
   about 4 minutes: a few downloads of 256 KB, 1 MB and 4 MB, then 10/20/30 chat users"""

READING = """
== how to read it: goodput ratio to minrtt per download size (higher is better),
   "x oracle" = the best completion time the traces allowed / the scheme's (1.0 = perfect),
   IM p90 = 90th percentile message delivery time (lower is better).
   The full method and the committed results: docs/results.md.

== The fleet loop: earlier trips' telemetry teaches the trainer where handovers
   fail; the live trip's proxy loads the learned table from Kafka; the trip's
   own telemetry goes back into LinkDB. Real Kafka, PostgreSQL + PostGIS,
   ingest, trainer and LinkDB API (about 4 minutes)"""


def main() -> int:
    print(INTRO, flush=True)
    os.environ["PROFILE"] = "demo"
    for name, default in (("SCHEMES", SCHEMES), ("BENCH_PREFIX", "hd")):
        os.environ[name] = os.environ.get(name) or default
    try:
        rc = hsr.main([])
    except hsr.BenchError as e:
        hsr.log(f"ERROR: {e}")
        return 1
    except KeyboardInterrupt:
        return 130
    if rc:
        return rc
    print(READING, flush=True)
    return demo_fleet.main()


if __name__ == "__main__":
    sys.exit(main())
