"""make bench-hsr: every scheme side by side on the same emulated HSR trips.

    PROFILE=<profile> python -m polycorn_benchrun.hsr

Profiles: demo, ci, short, full, long, precision, recovery, costs, concurrency,
sweep, transport, transport-unseen, transport-bulk (docs/benchmarks.md says what
each runs).

For each link set and trip, one copy of the topology per scheme (the harness's
:class:`~polycorn_harness.topology.Topology` over testbed/topology.sh, prefixes
hb0, hb1, ...) is built; all their emulators share one wall-clock epoch, so
every scheme sees the same capacity, delay, loss and handover realisation at
the same moment. Then one load generator
per topology runs the same plan (same seed), in phases (PHASES, below):
  bulk         downloads of 256 KB, 1 MB and 4 MB at random points of a window;
  im           instant messaging with 10, 20 and 30 users;
  backlog      one backlogged download, requests back to back across
               BACKLOG_S seconds, so that every handover failure in that
               window gets a recovery measurement (and, against
               single-path-c0/-c1, the best single carrier per trip);
  concurrency  CONC_USERS (1, 10, 100) concurrent backlogged passengers in
               turn, CONC_S seconds each, each passenger its own source
               address; per window the relay's and proxy's peak RSS (VmHWM,
               reset at the window's start) and metrics snapshots;
  sweep        (hsr only) after each trip's main pass, the trip replayed
               again for the SWEEP_SCHEMES (default minrtt hrsch, those in
               SCHEMES), one topology per scheme and memory budget
               (SWEEP_MIB, --mem-budget of relay and proxy), side by side:
               one backlogged download of SWEEP_S seconds each.
bench/polycorn_bench turns the records into ratios, oracle comparisons,
tables and plots.

Link sets:
  hsr       trips from polycorn-tracegen (preset pc-gateway-300, 2 carriers)
            on REPORT seeds: route seed 7, trip seeds 1001.. Development and
            tuning use route seeds 1-3 / trip seeds 1..99 (the v2 failure model's
            fit, unit tests); results are never reported on those.
  mahimahi  the real LTE traces of testbed/traces/mahimahi (T-Mobile and
            Verizon, driving; GPL-3.0 data, see its README) as carriers 0
            and 1, 30 ms one-way delay, no random loss, no scheduled
            blackouts (set MAHIMAHI_DIR to use another copy).
  driving   two longer real driving traces of the same collection, AT&T LTE
            (786 s) and T-Mobile UMTS (928 s), as carriers 0 and 1, 30 ms
            one-way delay, no random loss: real outages (21 and 32 gaps of
            1 s or more in their downlinks) on two unequal carriers. Trip k
            starts both traces DRIVING_STEP_S x k seconds in (rotated, so
            each trip sees another stretch of road); 1 trip in short and
            full, 3 in long.

Failure-location table (HRSCH's handover-failure-aware path rejection): the
trainer learns it from TABLE_TRIPS (default 20) PREVIOUS trips of the same
route (trip seeds 901..), never from a trip being measured; those trips go
through Kafka and ingest into a fresh LinkDB first (make_table). Every
scheme gets the table and the radio replay; only hof-reject uses it. The
closed loop, trip after trip, is polycorn_benchrun.loop (make bench-loop).

Environment: PROFILE (default short), SCHEMES (space-separated, must
include minrtt; default all below, precision: minrtt hrsch; a scheme
NAME@oracle, NAME@broad, NAME@early or NAME@mean runs pipeline NAME with
another failure table, and NAME~CC with congestion control CC on its
subflows instead of the default, e.g. minrtt~cubic; see up_topology;
direct-c<i> is the passengers' own TCP over carrier i without relay or
proxy, direct-c<i>~CC with CC at passenger and origin instead of bbr),
BENCH_PREFIX (topology prefix, default hb), LINK_SETS (default: the profile's),
BENCH_WORK (raw runs, default /tmp/polycorn-bench-hsr), BENCH_OUT (default
bench/out; the demo and ci profiles write only under BENCH_WORK), PLOTS
(directory for PNGs), SWEEP_SCHEMES (schemes of the budget sweep),
TRIP_PARALLEL (trips at once, default 1, precision 11), SEGMENT_TRACE (1:
relay and proxy of the main pass write a segment trace, --trace-dir, into
each scheme's run directory; bench/polycorn_bench/stalls.py reads it).

Diagnostics (development only; any of these makes the run a diagnostic
one: its results go under BENCH_WORK/out, never bench/out, and run.json
says "diagnostic"): ROUTE_SEED (default 7; development uses 1),
TRIP_SEED_BASE (measured trips are BASE+1.., default 1000),
TABLE_SEED_BASE (previous trips for the table, BASE+1.., default 900),
HSR_TRIPS (trips of the hsr set), BENCH_SLOT_S (seconds per download
slot), TABLE=previous|truth|none (truth: an oracle table built from the
measured trip's own events by `polycorn-tracegen failure-table`, every
failed cell, for an upper bound on hof-reject; none: no table),
PHASES (a subset of: bulk im backlog concurrency sweep; default the
profile's), CONC_USERS, CONC_S, SWEEP_MIB, SWEEP_S, TRACEGEN_PRESET
(default pc-gateway-300), PC_EMU_LOSS_KEYING (the emulator's
--loss-keying, default time) and LOAD_START_S (trip time of the load's
start in seconds, or auto: as soon as every topology is up; default 45 in
precision, recovery and the transport profiles, 120 in short, full and
long, auto in ci and demo). Results from before 2026-11-26 were
measured on TRACEGEN_PRESET=pc-gateway-300-v1 PC_EMU_LOSS_KEYING=packet.
Ctrl-C or any failure tears every topology down. Needs root (network namespaces)
and the release binaries (make build); run it with the workspace's Python itself
(.venv/bin/python, as make bench-hsr does), not under `uv run`, so that Ctrl-C or
a SIGTERM reaches it and every topology is torn down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polycorn_harness import ROOT, VENV, infra, provenance
from polycorn_harness.process import now_ms
from polycorn_harness.topology import (
    BINARIES,
    PROXY_METRICS,
    RELAY_METRICS,
    Topology,
    carrier_counters,
    run,
    scrape,
)
from polycorn_schema.startup import pg_connect

ALL_PHASES = ("bulk", "im", "backlog", "concurrency", "sweep")
DEFAULT_SCHEMES = (
    "minrtt hrsch minrtt+hpr minrtt+tpr minrtt+ori minrtt+er hrsch-k1 hrsch-k2 roundrobin "
    "redundant blest ecf single-path single-path-c0 single-path-c1 kernel-mptcp "
    "kernel-mptcp-conn minrtt+opp minrtt+pen minrtt+stale minrtt+hol hrsch+hol hrsch+stale "
    "hrsch+ hrsch+lead100 hrsch@mean"
)
DIAGNOSTIC_VARS = (
    "ROUTE_SEED",
    "TRIP_SEED_BASE",
    "TABLE_SEED_BASE",
    "HSR_TRIPS",
    "BENCH_SLOT_S",
    "TABLE",
    "PHASES",
    "CONC_USERS",
    "CONC_S",
    "SWEEP_MIB",
    "SWEEP_S",
    "TRACEGEN_PRESET",
    "PC_EMU_LOSS_KEYING",
    "LOAD_START_S",
)
ORIGIN = "10.99.0.10"
LOAD_SEED = 424242
CARRIERS = 2
N_SIZES = 3
DRIVING_TRACES = ("ATT-LTE-driving", "TMobile-UMTS-driving")
DRIVING_STEP_S = 240
CONC_SOURCE_BASE = "10.66.0.100"
CONC_GAP_S = 3
#: Topologies come up during the first seconds of the trip; the trip is generated
#: long enough for the longest warm-up allowed (22 topologies took 99 s on two busy
#: cores; a longer allowance costs only generated trip length).
MAX_WARMUP_S = 180
#: The backlogged download fetches this origin file (testbed/origin/make-files.sh).
BACKLOG_PATH = "/files/100MiB.bin"
BACKLOG_SIZE = 104857600
#: The passengers' own TCP over carrier i, no relay or proxy (topology.sh --scheme
#: direct-c<i>); NAME~CC picks the passengers' and the origin's congestion control.
DIRECT = re.compile(r"direct-c[0-9]+")
TABLE_VARIANTS = {
    # NAME@broad: lower thresholds (a cell enters with 2 failures and a 10 % share).
    "broad": ["--min-failures", "2", "--min-failure-rate", "0.1"],
    # NAME@early: failures at their 10th percentile (the trainer's default since
    # 2026-11-27, so the same as the run's table now); NAME@mean: at their mean.
    "early": ["--location-quantile", "0.1"],
    "mean": ["--location-quantile", "mean"],
}
#: Tables built from the measured trip's own events (NAME@oracle: every cell where it fails;
#: NAME@every: every cell it hands over in, the oracle plus a hold before every handover that
#: succeeds), and NAME@none: no table at all. Files under the trip's directory.
TRIP_TABLE_FILES = {
    "oracle": "failure-table-truth.json",
    "every": "failure-table-every.json",
    "none": "",
}
TRIP_TABLES = tuple(TRIP_TABLE_FILES)


@dataclass(frozen=True)
class Profile:
    per_size: int
    messages: int
    gap_ms: int
    hsr_trips: int
    sets: str
    slot_s: float
    im_win_s: int
    users: str
    backlog_s: int
    load_start: str
    conc_s: int
    sweep_mib: str
    sweep_s: int
    phases: str
    driving_trips: int = 1
    #: The railway the hsr trips run on (tracegen's route seed).
    route_seed: int = 7
    schemes: str = DEFAULT_SCHEMES
    #: The budget sweep's schemes, of those the run has (SWEEP_SCHEMES overrides).
    sweep_schemes: str = "minrtt hrsch"
    parallel: int = 1
    result: str = "hsr"


#: The subflow transports side by side: the tunnel over TLS/TCP and over QUIC, on each
#: carrier alone and on both, and the passengers' own TCP straight over each carrier.
TRANSPORT_SCHEMES = (
    "minrtt hrsch+ quic-minrtt quic-hrsch+ single-path-c0 single-path-c1 "
    "quic-single-path-c0 quic-single-path-c1 direct-c0 direct-c1"
)
#: The bulk downloads over each transport against the trace-optimal oracle, with the
#: baselines the transports are judged against: kernel MPTCP, and the passengers' own TCP
#: over each carrier with BBR and with CUBIC.
TRANSPORT_BULK_SCHEMES = (
    "minrtt hrsch+ quic-minrtt quic-hrsch+ kernel-mptcp-conn direct-c0 direct-c1 "
    "direct-c0~cubic direct-c1~cubic"
)
#: Many passengers at once: the default pipeline against minrtt, kernel MPTCP (one
#: connection per passenger) and each carrier alone.
CONCURRENCY_SCHEMES = "minrtt hrsch+ kernel-mptcp-conn single-path-c0 single-path-c1"
#: full's load; long, precision, recovery and the transport profiles derive from it.
FULL = Profile(
    per_size=10, messages=100, gap_ms=1000, hsr_trips=5, sets="hsr mahimahi driving",
    slot_s=15, im_win_s=115, users="10 20 30", backlog_s=300, load_start="120", conc_s=60,
    sweep_mib="8 16 32 64", sweep_s=180, phases="bulk im backlog",
)  # fmt: skip
#: Per profile (the module's docstring says what each is for).
PROFILES: dict[str, Profile] = {
    "ci": Profile(
        per_size=2, messages=5, gap_ms=300, hsr_trips=1, sets="hsr", slot_s=6, im_win_s=12,
        users="10", backlog_s=15, load_start="auto", conc_s=8, sweep_mib="8 64", sweep_s=10,
        phases=" ".join(ALL_PHASES),
    ),
    "demo": Profile(
        per_size=5, messages=15, gap_ms=500, hsr_trips=1, sets="hsr", slot_s=7, im_win_s=20,
        users="10 20 30", backlog_s=30, load_start="auto", conc_s=20,
        sweep_mib="8 16 32 64", sweep_s=30, phases="bulk im backlog",
    ),
    "short": Profile(
        per_size=6, messages=30, gap_ms=500, hsr_trips=1, sets="hsr mahimahi driving",
        slot_s=15, im_win_s=25, users="10 20 30", backlog_s=120, load_start="120", conc_s=30,
        sweep_mib="8 16 32 64", sweep_s=60, phases="bulk im backlog concurrency",
    ),
    "full": FULL,
    "long": replace(FULL, hsr_trips=31, driving_trips=3),
    "precision": replace(
        FULL, hsr_trips=31, sets="hsr", load_start="45", phases="bulk",
        schemes="minrtt hrsch", parallel=11, result="hsr-precision",
    ),
    "transport": replace(
        FULL, hsr_trips=31, load_start="45", phases="backlog", backlog_s=120,
        schemes=TRANSPORT_SCHEMES, result="hsr-transport",
    ),
    "transport-unseen": replace(
        FULL, hsr_trips=10, sets="hsr", load_start="45", phases="backlog", backlog_s=120,
        schemes=TRANSPORT_SCHEMES, route_seed=11, result="hsr-transport-unseen",
    ),
    "transport-bulk": replace(
        FULL, hsr_trips=10, sets="hsr", load_start="45", phases="bulk",
        schemes=TRANSPORT_BULK_SCHEMES, result="hsr-transport-bulk",
    ),
    "concurrency": replace(
        FULL, sets="hsr", load_start="45", phases="concurrency",
        schemes=CONCURRENCY_SCHEMES, result="hsr-concurrency",
    ),
    # The budget is a default chosen here, so it is swept on a development route.
    "sweep": replace(
        FULL, hsr_trips=3, sets="hsr", load_start="45", phases="sweep", route_seed=1,
        schemes="minrtt hrsch+", sweep_schemes="minrtt hrsch+", result="hsr-sweep",
    ),
    # A long backlog: failed handovers are rare, and each gives one recovery window.
    "recovery": replace(
        FULL, hsr_trips=16, sets="hsr", load_start="45", phases="backlog", backlog_s=1200,
        schemes="minrtt hrsch hrsch@oracle hrsch@mean hrsch+ hrsch+lead100", parallel=4,
        result="hsr-recovery",
    ),
    # What a caught failure saves and what a needless hold costs, on the default pipeline:
    # the trainer's decision rule weighs the two (polycorn_bench.costs).
    # The decision rule is chosen here, so it is measured on a development route.
    "costs": replace(
        FULL, hsr_trips=24, sets="hsr", load_start="45", phases="backlog", route_seed=1,
        schemes="minrtt hrsch+@none hrsch+@oracle hrsch+@every",
        parallel=4, result="hsr-costs",
    ),
}  # fmt: skip


class BenchError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"bench-hsr: {msg}", file=sys.stderr, flush=True)


def _int(name: str, v: str, *, positive: bool = False) -> int:
    if not re.fullmatch(r"[1-9][0-9]*" if positive else r"[0-9]+", v):
        kind = "a positive" if positive else "a non-negative"
        raise BenchError(f"{name} must be {kind} integer, got {v!r}")
    return int(v)


@dataclass
class Settings:
    """The profile with the environment's overrides, checked."""

    profile: str
    p: Profile
    diagnostic: bool
    bin: Path
    work: Path
    out: Path
    plots: Path
    mahimahi: Path
    route_seed: int
    preset: str
    trip_seed_base: int
    table_seed_base: int
    table: str
    table_trips: int
    schemes: list[str]
    trip_parallel: int
    segment_trace: bool
    load_start: str
    hsr_trips: int
    phases: list[str]
    conc_s: int
    conc_counts: list[int]
    sweep_budgets: list[int]
    sweep_s: int
    slot_s: float
    link_sets: list[str]
    users: list[int]
    prefix: str
    sweep_list: list[str] = field(default_factory=list)
    #: The provenance of the run's start (polycorn_harness.provenance), for run.json.
    started: dict[str, Any] = field(default_factory=dict)

    def has(self, phase: str) -> bool:
        return phase in self.phases

    @property
    def bulk_s(self) -> int:
        return int(self.p.per_size * N_SIZES * self.slot_s + 0.999) if self.has("bulk") else 0

    @property
    def im_s(self) -> int:
        return self.p.im_win_s * len(self.users) if self.has("im") else 0

    @property
    def backlog_s(self) -> int:
        return self.p.backlog_s if self.has("backlog") else 0

    @property
    def conc_total_s(self) -> int:
        return (self.conc_s + CONC_GAP_S) * len(self.conc_counts) if self.has("concurrency") else 0

    @property
    def sweep_units(self) -> list[tuple[int, str]]:
        if not self.has("sweep"):
            return []
        return [(m, s) for m in self.sweep_budgets for s in self.sweep_list]

    @property
    def trip_s(self) -> int:
        t = MAX_WARMUP_S + self.bulk_s + self.im_s + self.backlog_s + self.conc_total_s + 15
        return max(t, MAX_WARMUP_S + self.sweep_s + 15)

    @property
    def n_topo(self) -> int:
        """Topologies per trip: the schemes of the main pass, or the sweep's units."""
        return max(len(self.schemes), len(self.sweep_units))

    @classmethod
    def from_env(cls) -> Settings:
        e = os.environ.get
        profile = _profile(e("PROFILE", "short"))
        p = PROFILES[profile]
        diagnostic = any(e(v) for v in DIAGNOSTIC_VARS)
        work = Path(e("BENCH_WORK", "/tmp/polycorn-bench-hsr"))
        if profile in ("demo", "ci") or diagnostic:
            out = Path(e("BENCH_OUT", str(work / "out")))
        else:
            out = Path(e("BENCH_OUT", str(ROOT / "bench" / "out")))
        # Checked in this order, each before the next: the first bad setting is the
        # one reported.
        schemes = _schemes(e("SCHEMES") or p.schemes)
        segment_trace = _segment_trace(e("SEGMENT_TRACE", "0"))
        load_start = _load_start(e("LOAD_START_S") or p.load_start)
        phases = _phases(e("PHASES") or p.phases)
        conc_counts = _conc_counts(e("CONC_USERS", "1 10 100"))
        table = _table(e("TABLE", "previous"))
        slot = _slot(e("BENCH_SLOT_S"))
        prefix = _prefix(e("BENCH_PREFIX", "hb"))
        sets = _link_sets(e("LINK_SETS") or p.sets)
        st = cls(
            profile=profile,
            p=p,
            diagnostic=diagnostic,
            bin=Path(e("BIN", str(ROOT / "target" / "release"))),
            work=work,
            out=out,
            plots=Path(e("PLOTS", str(out / f"plots-{profile}"))),
            mahimahi=Path(e("MAHIMAHI_DIR", str(ROOT / "testbed" / "traces" / "mahimahi"))),
            route_seed=_int("ROUTE_SEED", e("ROUTE_SEED") or str(p.route_seed)),
            preset=e("TRACEGEN_PRESET", "pc-gateway-300"),
            trip_seed_base=_int("TRIP_SEED_BASE", e("TRIP_SEED_BASE", "1000")),
            table_seed_base=_int("TABLE_SEED_BASE", e("TABLE_SEED_BASE", "900")),
            table=table,
            table_trips=_int("TABLE_TRIPS", e("TABLE_TRIPS", "20"), positive=True),
            schemes=schemes,
            trip_parallel=_int(
                "TRIP_PARALLEL", e("TRIP_PARALLEL") or str(p.parallel), positive=True
            ),
            segment_trace=segment_trace,
            load_start=load_start,
            hsr_trips=_int("HSR_TRIPS", e("HSR_TRIPS") or str(p.hsr_trips), positive=True),
            phases=phases,
            conc_s=_int("CONC_S", e("CONC_S") or str(p.conc_s), positive=True),
            conc_counts=conc_counts,
            sweep_budgets=[
                _int("SWEEP_MIB", m, positive=True) for m in (e("SWEEP_MIB") or p.sweep_mib).split()
            ],
            sweep_s=_int("SWEEP_S", e("SWEEP_S") or str(p.sweep_s), positive=True),
            slot_s=float(slot) if slot is not None else p.slot_s,
            link_sets=sets,
            users=[int(u) for u in p.users.split()],
            prefix=prefix,
        )
        if st.has("sweep"):
            st.sweep_list = _sweep_list(e("SWEEP_SCHEMES"), schemes, p.sweep_schemes)
        return st


def _profile(profile: str) -> str:
    if profile not in PROFILES:
        raise BenchError(f"PROFILE must be one of {', '.join(PROFILES)}, got {profile!r}")
    return profile


def _schemes(v: str) -> list[str]:
    """SCHEMES: minrtt among them, and each suffix one a scheme of its kind can take."""
    schemes = v.split()
    if "minrtt" not in schemes:
        raise BenchError("SCHEMES must include minrtt (the reference of every ratio)")
    for s in schemes:
        if "@" in s and s.split("@", 1)[1] not in TRIP_TABLES + tuple(TABLE_VARIANTS):
            suffixes = ", ".join(f"@{t}" for t in TRIP_TABLES + tuple(TABLE_VARIANTS))
            raise BenchError(f"scheme {s!r}: the only table suffixes are {suffixes}")
        pipe = s.split("@", 1)[0]
        if "~" in pipe and not re.fullmatch(r"[^~]+~[a-z0-9_-]{1,20}", pipe):
            raise BenchError(
                f"scheme {s!r}: a congestion-control suffix is ~NAME: a kernel algorithm, "
                "or for quic-NAME a --quic-cc controller"
            )
        if is_direct(s) and "@" in s:
            raise BenchError(f"scheme {s!r}: a direct scheme runs no relay, so no table")
    return schemes


def _segment_trace(v: str) -> bool:
    if v not in ("0", "1"):
        raise BenchError(f"SEGMENT_TRACE must be 0 or 1, got {v!r}")
    return v == "1"


def _load_start(v: str) -> str:
    """LOAD_START_S: auto, or whole seconds within the warm-up the trip is generated for."""
    if v != "auto":
        if not re.fullmatch(r"[1-9][0-9]*", v):
            raise BenchError(f"LOAD_START_S must be a number of seconds or auto: {v!r}")
        if int(v) > MAX_WARMUP_S:
            raise BenchError(
                f"LOAD_START_S must be at most {MAX_WARMUP_S} s (the trip is generated for "
                f"that warm-up), got {v}"
            )
    return v


def _phases(v: str) -> list[str]:
    phases = v.split()
    if not phases:
        raise BenchError(f"PHASES is empty (a subset of: {' '.join(ALL_PHASES)})")
    for ph in phases:
        if ph not in ALL_PHASES:
            raise BenchError(f"unknown phase {ph!r} in PHASES (a subset of: {ALL_PHASES})")
    return phases


def _conc_counts(v: str) -> list[int]:
    counts = [_int("CONC_USERS", u, positive=True) for u in v.split()]
    if any(u > 154 for u in counts):
        raise BenchError(f"CONC_USERS must be integers 1..154, got {counts}")
    return counts


def _table(v: str) -> str:
    if v not in ("previous", "truth", "none"):
        raise BenchError(f"TABLE must be previous, truth or none, got {v!r}")
    return v


def _slot(v: str | None) -> str | None:
    """BENCH_SLOT_S, if set: seconds, a fraction allowed."""
    if v is not None and not re.fullmatch(r"[0-9]+(\.[0-9]+)?", v):
        raise BenchError(f"BENCH_SLOT_S must be a number of seconds, got {v!r}")
    return v


def _prefix(v: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", v):
        raise BenchError(f"BENCH_PREFIX must be 1-8 lower-case letters/digits, got {v!r}")
    return v


def _link_sets(v: str) -> list[str]:
    sets = v.split()
    for s in sets:
        if s not in ("hsr", "mahimahi", "driving"):
            raise BenchError(f"unknown link set {s!r} (hsr, mahimahi, driving)")
    return sets


def _sweep_list(v: str | None, schemes: list[str], default: str) -> list[str]:
    """SWEEP_SCHEMES, by default those of the profile's ``default`` the run has."""
    sweep: list[str] = v.split() if v else [s for s in default.split() if s in schemes]
    if any(is_direct(x) for x in sweep):
        raise BenchError("SWEEP_SCHEMES: a direct scheme has no relay or proxy budget")
    return sweep


def is_direct(scheme: str) -> bool:
    """A ``direct-c<i>`` scheme (with or without ``~CC``): no relay, no proxy."""
    return DIRECT.fullmatch(scheme.split("~", 1)[0]) is not None


def uses_table(s: Settings, name: str) -> bool:
    """Whether a scheme NAME@<name> of the run asks for that table."""
    return any(x.endswith(f"@{name}") for x in s.schemes)


class TcpMem:
    """Kernel TCP memory: the concurrency phase keeps N_TOPO x 100 downloads busy at
    once on one kernel, far more TCP memory than a train or a proxy pod ever holds,
    and tcp_mem is global: at its limit the kernel stalls every socket, carriers
    included. Raised for the run (pressure at a quarter of RAM, the limit at three
    eighths) and restored on exit."""

    PATH = Path("/proc/sys/net/ipv4/tcp_mem")

    def __init__(self) -> None:
        self.saved = self.PATH.read_text().strip()

    def raise_(self) -> None:
        m = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
        pages = int(m[1]) // 4 if m else 0
        low, pressure, high = (int(x) for x in self.saved.split())
        pressure, high = max(pressure, pages // 4), max(high, pages * 3 // 8)
        try:
            self.PATH.write_text(f"{low} {pressure} {high}")
            log(f"tcp_mem {self.saved} -> {self.PATH.read_text().strip()} (pages) for the run")
        except OSError:
            log(
                f"WARNING: cannot raise tcp_mem ({self.saved} pages): many concurrent passengers "
                "may stall every socket"
            )

    def restore(self) -> None:
        with contextlib.suppress(OSError):
            self.PATH.write_text(self.saved)


class Bench:
    def __init__(self, s: Settings, run_dir: Path) -> None:
        self.s, self.run = s, run_dir
        self.stopping = threading.Event()
        self.table_db: tuple[str, str] | None = None  # (admin URL, database name)

    # ---- topologies

    def prefix(self, base: int, i: int) -> str:
        return f"{self.s.prefix}{base + i}"

    def topology(self, base: int, i: int, trip: Path) -> Topology:
        return Topology(self.prefix(base, i), trip, self.s.bin)

    def all_down(self, base: int, count: int) -> None:
        """Topologies 0..count-1 of the block at ``base``, in parallel (each takes a
        few seconds: processes get SIGTERM and time to exit before SIGKILL)."""

        def down(i: int) -> None:
            try:
                self.topology(base, i, self.run).down()
            except (AssertionError, subprocess.TimeoutExpired) as e:
                log(f"teardown of {self.prefix(base, i)}: {e}")

        parallel([lambda i=i: down(i) for i in range(count)])  # type: ignore[misc]

    def up_topology(
        self,
        base: int,
        i: int,
        scheme: str,
        epoch: int,
        k: int,
        *,
        tdir: Path,
        what: str,
        table: Path | None,
        relay_args: Sequence[str] = (),
        proxy_args: Sequence[str] = (),
    ) -> None:
        """One copy replaying ``tdir/trip``. NAME@oracle is the pipeline NAME with the
        trip's oracle table instead of the run's, NAME@every with every cell the trip
        hands over in, NAME@none with no table, NAME@broad/@early/@mean with the
        trainer's table at other parameters; NAME~CC runs NAME with relay and proxy
        ``--subflow-cc CC``."""
        if "@" in scheme:
            which = scheme.split("@", 1)[1]
            f = (
                tdir / TRIP_TABLE_FILES[which]
                if which in TRIP_TABLE_FILES
                else self.run / f"failure-table-{which}.json"
            )
            hsr = tdir.parent == self.run / "hsr"
            table = f if which != "none" and hsr and f.exists() else None
        pipeline = scheme.split("@", 1)[0]
        relay, proxy = list(relay_args), list(proxy_args)
        direct_cc: str | None = None
        if is_direct(pipeline):
            # No relay or proxy to give flags or a table to; ~CC is the end hosts'.
            relay, proxy, table = [], [], None
            pipeline, _, cc = pipeline.partition("~")
            direct_cc = cc or None
        elif "~" in pipeline:
            pipeline, cc = pipeline.split("~", 1)
            # quic-NAME~CC: the QUIC subflows' controller (--quic-cc).
            flag = "--quic-cc" if pipeline.startswith("quic-") else "--subflow-cc"
            relay.append(f"{flag}={cc}")
            proxy.append(f"{flag}={cc}")
        topo = self.topology(base, i, tdir / "trip")
        try:
            topo.up(
                pipeline,
                epoch_unix_ms=epoch,
                failure_table=table,
                relay_args=relay,
                proxy_args=proxy,
                seed=LOAD_SEED + k,
                cc=direct_cc,
            )
        except AssertionError as e:
            raise BenchError(
                f"{what}: topology for {scheme} failed (logs: {topo.state}/logs): {e}"
            ) from e

    def warm_up(self, epoch: int) -> int:
        """Trip time (s) at which the load starts, once every topology is up:
        LOAD_START_S when set (a fixed trip time, so that a rerun puts every download
        at the same place of the trip), else as soon as they are."""
        warm = max(15, (now_ms() - epoch) // 1000 + 5)
        if warm > MAX_WARMUP_S:
            raise BenchError(f"topologies took {warm}s to come up (more than {MAX_WARMUP_S} s)")
        if self.s.load_start != "auto":
            if warm > int(self.s.load_start):
                log(
                    f"WARNING: topologies took {warm}s to come up, later than LOAD_START_S="
                    f"{self.s.load_start}: the load starts at {warm}s, so this trip's downloads "
                    "sit elsewhere than in other runs"
                )
            else:
                warm = int(self.s.load_start)
        return warm

    # ---- link sets and trips

    def trip_ids(self, link_set: str) -> list[str]:
        s = self.s
        if link_set == "hsr":
            return [f"r{s.route_seed}-t{s.trip_seed_base + 1 + k}" for k in range(s.hsr_trips)]
        if link_set == "mahimahi":
            return ["tmobile-verizon"]
        n = int(os.environ.get("DRIVING_TRIPS") or self.s.p.driving_trips)
        return [f"att-umts-{DRIVING_STEP_S * k}s" for k in range(n)]

    def make_trip(self, link_set: str, k: int, d: Path) -> None:
        """The link files of one trip."""
        s = self.s
        if link_set == "hsr":
            run(
                [str(s.bin / "polycorn-tracegen"), "generate", "--preset", s.preset]
                + ["--route-seed", str(s.route_seed), "--trip-seed", str(s.trip_seed_base + 1 + k)]
                + ["--duration-s", str(s.trip_s), "--carriers", str(CARRIERS), "--out", str(d)]
            )
            return
        d.mkdir(parents=True, exist_ok=True)
        if link_set == "mahimahi":
            for i, name in enumerate(("TMobile-LTE-short", "Verizon-LTE-short")):
                shutil.copyfile(s.mahimahi / f"{name}.up", d / f"c{i}.up")
                shutil.copyfile(s.mahimahi / f"{name}.down", d / f"c{i}.down")
                (d / f"c{i}.schedule").write_text(
                    f"# {name}, Mahimahi LTE trace: constant delay, no loss, no blackouts\n"
                    "delay 0 30\n"
                )
            return
        off = DRIVING_STEP_S * k * 1000
        for i, name in enumerate(DRIVING_TRACES):
            for way in ("up", "down"):
                # A trace started off ms in, as its player would reach it, every
                # opportunity and the period kept (polycorn_bench.links).
                r = subprocess.run(
                    ["uv", "run", "--project", "bench", "--locked", "--quiet", "python", "-m"]
                    + ["polycorn_bench.links", "rotate", str(s.mahimahi / f"{name}.{way}")]
                    + [str(off), str(d / f"c{i}.{way}")],
                    cwd=ROOT,
                    check=False,
                )
                if r.returncode != 0:
                    raise BenchError(f"cannot cut {name}.{way} at {off} ms")
            (d / f"c{i}.schedule").write_text(
                f"# {name} from {off} ms, Mahimahi driving trace: constant delay, no loss, "
                "no scheduled blackouts\ndelay 0 30\n"
            )

    # ---- the failure-location table

    def make_table(self) -> None:
        """The table the trainer learns from previous trips of the route (seeds
        TABLE_SEED_BASE+1..+TABLE_TRIPS), through the fleet's real path: each trip's
        telemetry into Kafka, polycorn-ingest into a fresh LinkDB (trainer_fleet's load
        checks every count), then ``polycorn-trainer run --once`` with its defaults."""
        s = self.s
        env = infra.up(services=["pg", "kafka"])
        base = env["POLYCORN_DATABASE_URL"].rsplit("/", 1)[0]
        db = f"linkdb_bench_hsr_{os.getpid()}"
        url = f"{base}/{db}"
        with pg_connect(f"{base}/postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {db}")
        self.table_db = (f"{base}/postgres", db)
        run([str(VENV / "polycorn-linkdb"), "--url", url, "upgrade"], timeout=600)
        first, last = s.table_seed_base + 1, s.table_seed_base + s.table_trips
        with (self.run / "table-load.log").open("w") as f:
            r = subprocess.run(
                [str(VENV / "python"), "-m", "polycorn_benchrun.trainer_fleet", "load"]
                + ["--route-seed", str(s.route_seed), "--trip-seeds", f"{first}-{last}"]
                + ["--duration-s", str(s.trip_s), "--carriers", str(CARRIERS)]
                + ["--preset", s.preset, "--tracegen", str(s.bin / "polycorn-tracegen")]
                + ["--database-url", url, "--bootstrap", env["POLYCORN_KAFKA_BOOTSTRAP"]]
                + ["--work", str(self.run / "table-trips")]
                + ["--out", str(self.run / "table-fleet.json")],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if r.returncode != 0:
            raise BenchError(f"loading the previous trips into LinkDB failed: {f.name}")
        self.trainer_table(url, "")
        table = self.run / "failure-table.json"
        if not table.exists() or not table.read_text().strip():
            raise BenchError(
                "the trainer published no table (no cell met its thresholds): "
                f"{self.run}/trainer.json"
            )
        n = len(json.loads(table.read_text())["entries"])
        log(f"failure-location table: {n} cells, learned from {s.table_trips} previous trips")
        for name, args in TABLE_VARIANTS.items():
            if uses_table(s, name):
                self.trainer_table(url, f"-{name}", *args)
                f2 = self.run / f"failure-table-{name}.json"
                m = len(json.loads(f2.read_text())["entries"])
                log(f"{name} failure-location table ({' '.join(args)}): {m} cells")

    def trainer_table(self, url: str, suffix: str, *args: str) -> None:
        """``polycorn-trainer run --once`` on LinkDB ``url``; the table it published into
        RUN/failure-table<suffix>.json, its summary and log beside it."""
        with (self.run / f"trainer{suffix}.log").open("w") as f:
            r = subprocess.run(
                [str(VENV / "polycorn-trainer"), "--log-level", "WARNING", "run", "--once"]
                + ["--database-url", url, "--bootstrap", "", *args]
                + ["--summary-json", str(self.run / f"trainer{suffix}.json")],
                stdout=subprocess.DEVNULL,
                stderr=f,
                check=False,
            )
        if r.returncode != 0:
            raise BenchError(f"the trainer {' '.join(args)} failed: {f.name}")
        with pg_connect(url) as c:
            row = c.execute(
                "SELECT body FROM failure_tables ORDER BY version DESC LIMIT 1"
            ).fetchone()
        body = row[0] if row else None
        text = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
        (self.run / f"failure-table{suffix}.json").write_text(text + "\n" if text else "")

    def drop_table_db(self) -> None:
        if self.table_db is None:
            return
        admin, db = self.table_db
        try:
            with pg_connect(admin, autocommit=True, timeout_s=30) as c:
                c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        except Exception as e:
            log(f"could not drop {db}: {e}")

    # ---- load

    def loadgen(self, ns: str, d: Path, what: str, *args: str) -> None:
        """One ``polycorn-loadgen`` step in namespace ``ns``; logged, never fatal."""
        if self.stopping.is_set():
            return
        with (d / "loadgen.log").open("a") as f:
            rc = subprocess.run(
                ["ip", "netns", "exec", ns, str(self.s.bin / "polycorn-loadgen"), *args],
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        if rc != 0 and not self.stopping.is_set():
            log(f"{d}: {what} exited with {rc}")

    def mem_reset(self, prefix: str) -> None:
        """The relay's and proxy's peak RSS (VmHWM) reset to their current RSS
        (/proc/PID/clear_refs 5), so that VmHWM read later is the peak since now."""
        for name in ("relay", "proxy"):
            with contextlib.suppress(OSError):
                pid = (Path(f"/tmp/polycorn-state-{prefix}") / "run" / f"{name}.pid").read_text()
                Path(f"/proc/{pid.strip()}/clear_refs").write_text("5")

    def mem_snapshot(self, prefix: str, d: Path, n: int) -> None:
        """After concurrency window ``n``: the relay's and proxy's VmHWM and VmRSS (kB)
        into d/concurrency-n.mem.json, their metrics into d/logs/."""
        doc: dict[str, Any] = {"users": n}
        for name in ("relay", "proxy"):
            entry: dict[str, int | None] = {"pid": None, "vm_hwm_kb": None, "vm_rss_kb": None}
            try:
                pid = int(
                    (Path(f"/tmp/polycorn-state-{prefix}") / "run" / f"{name}.pid").read_text()
                )
                status = Path(f"/proc/{pid}/status").read_text()
                entry["pid"] = pid
                for key, field_ in (("VmHWM", "vm_hwm_kb"), ("VmRSS", "vm_rss_kb")):
                    m = re.search(rf"^{key}:\s+(\d+)", status, re.M)
                    entry[field_] = int(m[1]) if m else None
            except (OSError, ValueError):
                pass
            doc[name] = entry
        (d / f"concurrency-{n}.mem.json").write_text(json.dumps(doc) + "\n")
        topo = Topology(prefix, self.run, self.s.bin)
        (d / "logs").mkdir(parents=True, exist_ok=True)
        for name, which, addr in (
            ("relay", "train", RELAY_METRICS),
            ("proxy", "cloud", PROXY_METRICS),
        ):
            text = scrape(topo.ns(which), addr, timeout_s=2)
            (d / "logs" / f"concurrency-{n}.{name}.metrics").write_text(text or "")

    def sample_carriers(self, prefix: str, epoch: int, times_s: Sequence[int], out: Path) -> None:
        """The train's carrier counters (:func:`carrier_counters`) at each trip time of
        ``times_s``, into ``out`` (JSON: ``samples``, each with its trip time ``t_ms``),
        so that the analysis knows what each carrier delivered over a window, whatever the
        scheme: the emulator's downlink of carrier i ends in car<i>."""
        samples: list[dict[str, Any]] = []
        for t in times_s:
            if self.stopping.wait(max(0.0, (epoch + t * 1000 - now_ms()) / 1000)):
                return
            c = carrier_counters(f"{prefix}-train")
            if c is not None:
                samples.append({"t_ms": now_ms() - epoch, **c})
        out.write_text(json.dumps({"samples": samples}) + "\n")

    def run_load(self, d: Path, prefix: str, epoch: int, start: int, *, direct: bool) -> None:
        """The whole plan of one scheme; ``direct``: no relay or proxy to measure."""
        s = self.s
        ns = f"{prefix}-pax"
        common = ["--epoch-unix-ms", str(epoch)]
        t = start
        if s.has("bulk"):
            t = start + s.bulk_s
            self.loadgen(
                ns, d, "bulk", "bulk", "--origin", f"{ORIGIN}:80", *common,
                "--seed", str(LOAD_SEED), "--window-s", f"{start}:{t}",
                "--per-size", str(s.p.per_size), "--out", str(d / "bulk.jsonl"),
            )  # fmt: skip
        if s.has("im"):
            for u in s.users:
                self.loadgen(
                    ns, d, f"im {u}", "im", "--server", f"{ORIGIN}:7100", *common,
                    "--seed", str(LOAD_SEED + u), "--users", str(u),
                    "--messages", str(s.p.messages), "--mean-gap-ms", str(s.p.gap_ms),
                    "--start-s", str(t), "--deadline-s", str(t + s.p.im_win_s - 1),
                    "--source-base", "10.66.0.100", "--out", str(d / f"im-{u}.jsonl"),
                )  # fmt: skip
                t += s.p.im_win_s
        # Every link set: recovery after handover failures (hsr) and the comparison with
        # the best single carrier.
        if s.backlog_s > 0:
            sampler = threading.Thread(
                target=self.sample_carriers,
                args=(prefix, epoch, (t, t + s.backlog_s), d / "backlog.carriers.json"),
                daemon=True,
            )
            sampler.start()
            self.loadgen(
                ns, d, "backlog", "backlog", "--origin", f"{ORIGIN}:80", *common,
                "--window-s", f"{t}:{t + s.backlog_s}", "--path", BACKLOG_PATH,
                "--size", str(BACKLOG_SIZE), "--out", str(d / "backlog.jsonl"),
            )  # fmt: skip
            while sampler.is_alive():
                sampler.join(0.5)
            t += s.backlog_s
        if s.has("concurrency"):
            for u in s.conc_counts:
                t += CONC_GAP_S
                if not direct:
                    self.mem_reset(prefix)
                self.loadgen(
                    ns, d, f"concurrency {u}", "backlog", "--origin", f"{ORIGIN}:80", *common,
                    "--window-s", f"{t}:{t + s.conc_s}", "--path", BACKLOG_PATH,
                    "--size", str(BACKLOG_SIZE), "--users", str(u),
                    "--source-base", CONC_SOURCE_BASE, "--out", str(d / f"concurrency-{u}.jsonl"),
                )  # fmt: skip
                if not direct:
                    self.mem_snapshot(prefix, d, u)
                t += s.conc_s

    def extra_passengers(self, prefix: str) -> None:
        """The concurrency phase's source addresses beyond the 10.66.0.100-163 that
        topology.sh adds."""
        top = 100 + max(self.s.conc_counts)
        for k in range(164, top):
            subprocess.run(
                ["ip", "-n", f"{prefix}-pax", "addr", "add", f"10.66.0.{k}/24", "dev", "pax0"],
                capture_output=True,
                check=False,
            )

    # ---- a trip

    def run_trip(self, link_set: str, k: int, tid: str, slot: int) -> None:
        """One trip on the slot-th block of topologies."""
        s = self.s
        base = slot * s.n_topo
        tdir = self.run / link_set / tid
        tdir.mkdir(parents=True, exist_ok=True)
        self.make_trip(link_set, k, tdir / "trip")
        table: Path | None = None
        truth = tdir / "failure-table-truth.json"
        if link_set == "hsr" and (s.table == "truth" or uses_table(s, "oracle")):
            # Oracle: every cell where this very trip fails.
            run(
                [str(s.bin / "polycorn-tracegen"), "failure-table", "--events"]
                + [str(tdir / "trip" / "events.jsonl"), "--min-failures", "1"]
                + ["--min-failure-rate", "0", "--out", str(truth)]
            )
            n = len(json.loads(truth.read_text())["entries"])
            log(f"{link_set}/{tid}: oracle failure table, {n} cells")
        if link_set == "hsr" and uses_table(s, "every"):
            # The oracle plus a hold before every handover that succeeds.
            every = tdir / TRIP_TABLE_FILES["every"]
            run(
                [str(s.bin / "polycorn-tracegen"), "failure-table", "--events"]
                + [str(tdir / "trip" / "events.jsonl"), "--every-handover", "--out", str(every)]
            )
            n = len(json.loads(every.read_text())["entries"])
            log(f"{link_set}/{tid}: every-handover table, {n} cells")
        if link_set == "hsr" and s.table == "previous":
            table = self.run / "failure-table.json"
        elif link_set == "hsr" and s.table == "truth":
            table = truth
        # PHASES with the sweep alone: no main pass.
        if any(s.has(p) for p in ("bulk", "im", "backlog", "concurrency")):
            self.run_main(link_set, k, tid, base, table)
        if link_set == "hsr" and s.sweep_units:
            self.run_sweep(link_set, k, tid, base, table)

    def run_main(self, link_set: str, k: int, tid: str, base: int, table: Path | None) -> None:
        """Every scheme side by side, the selected phases one after the other."""
        s = self.s
        tdir = self.run / link_set / tid
        epoch = now_ms()
        log(f"{link_set}/{tid}: building {len(s.schemes)} topologies (epoch {epoch})")
        for i, scheme in enumerate(s.schemes):
            trace: list[str] = []
            if s.segment_trace:
                trace = [f"--trace-dir={tdir / scheme / 'trace'}"]
            self.up_topology(
                base, i, scheme, epoch, k, tdir=tdir, what=f"{link_set}/{tid}", table=table,
                relay_args=trace, proxy_args=trace,
            )  # fmt: skip
            if s.has("concurrency"):
                self.extra_passengers(self.prefix(base, i))
        warm = self.warm_up(epoch)
        plan = []
        if s.has("bulk"):
            plan.append(f"{s.p.per_size * N_SIZES} downloads in {s.bulk_s}s")
        if s.has("im"):
            plan.append(f"IM {' '.join(map(str, s.users))} users")
        if s.backlog_s > 0:
            plan.append(f"a backlogged download for {s.backlog_s}s")
        if s.has("concurrency"):
            plan.append(
                f"{' '.join(map(str, s.conc_counts))} concurrent passengers, {s.conc_s}s each"
            )
        log(f"{link_set}/{tid}: load from trip time {warm}s: {'; '.join(plan)}")
        for scheme in s.schemes:
            (tdir / scheme).mkdir(parents=True, exist_ok=True)
        parallel(
            [
                lambda i=i, scheme=scheme: self.run_load(  # type: ignore[misc]
                    tdir / scheme, self.prefix(base, i), epoch, warm, direct=is_direct(scheme)
                )
                for i, scheme in enumerate(s.schemes)
            ]
        )
        for i, scheme in enumerate(s.schemes):
            self.topology(base, i, tdir / "trip").collect(
                tdir / scheme, endpoints=not is_direct(scheme)
            )
        timing = {"link_set": link_set, "trip": tid, "epoch_unix_ms": epoch, "load_start_s": warm}
        (tdir / "timing.json").write_text(json.dumps(timing) + "\n")
        self.all_down(base, s.n_topo)
        # The emulator prints its per-link stats on SIGTERM (at teardown).
        for i, scheme in enumerate(s.schemes):
            emu = Path(f"/tmp/polycorn-state-{self.prefix(base, i)}") / "logs" / "emu.log"
            if emu.exists():
                shutil.copy2(emu, tdir / scheme / "logs" / "emu.log")

    def run_sweep(self, link_set: str, k: int, tid: str, base: int, table: Path | None) -> None:
        """The trip replayed again from its start, one topology per sweep scheme and
        budget (relay and proxy --mem-budget), side by side; each runs one backlogged
        download of SWEEP_S seconds. Records in TRIP/sweep/<MiB>/<scheme>/."""
        s = self.s
        tdir = self.run / link_set / tid
        units = s.sweep_units
        epoch = now_ms()
        log(
            f"{link_set}/{tid}: budget sweep, {len(units)} topologies "
            f"({' '.join(map(str, s.sweep_budgets))} MiB x {' '.join(s.sweep_list)}; epoch {epoch})"
        )
        for i, (m, scheme) in enumerate(units):
            budget = [f"--mem-budget={m * 1048576}"]
            self.up_topology(
                base, i, scheme, epoch, k, tdir=tdir, what=f"{link_set}/{tid} sweep {m} MiB",
                table=table, relay_args=budget, proxy_args=budget,
            )  # fmt: skip
        warm = self.warm_up(epoch)
        what = f"a backlogged download for {s.sweep_s}s"
        log(f"{link_set}/{tid}: sweep load from trip time {warm}s: {what}")
        dirs = [tdir / "sweep" / str(m) / scheme for m, scheme in units]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        parallel(
            [
                lambda i=i, d=d: self.loadgen(  # type: ignore[misc]
                    f"{self.prefix(base, i)}-pax", d, "backlog", "backlog",
                    "--origin", f"{ORIGIN}:80", "--epoch-unix-ms", str(epoch),
                    "--window-s", f"{warm}:{warm + s.sweep_s}", "--path", BACKLOG_PATH,
                    "--size", str(BACKLOG_SIZE), "--out", str(d / "backlog.jsonl"),
                )
                for i, d in enumerate(dirs)
            ]
        )  # fmt: skip
        for i, d in enumerate(dirs):
            self.topology(base, i, tdir / "trip").collect(d)
        timing = {"link_set": link_set, "trip": tid, "epoch_unix_ms": epoch, "load_start_s": warm}
        (tdir / "sweep" / "timing.json").write_text(json.dumps(timing) + "\n")
        self.all_down(base, len(units))
        for i, d in enumerate(dirs):
            emu = Path(f"/tmp/polycorn-state-{self.prefix(base, i)}") / "logs" / "emu.log"
            if emu.exists():
                shutil.copy2(emu, d / "logs" / "emu.log")


def parallel(tasks: Sequence[Callable[[], None]]) -> None:
    """Run ``tasks`` at once, each in a thread; re-raise the first failure after all
    have ended. The wait is interruptible (Ctrl-C)."""
    errors: list[BaseException] = []

    def wrap(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(t,), daemon=True) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    if errors:
        raise errors[0]


def run_json(s: Settings, b: Bench, sets: dict[str, Any]) -> dict[str, Any]:
    table = b.run / "failure-table.json"
    ft = None
    if table.exists() and table.read_text().strip():
        first, last = s.table_seed_base + 1, s.table_seed_base + s.table_trips
        ft = {
            "learned_by": "polycorn-trainer (defaults), previous trips through Kafka and ingest "
            "into LinkDB",
            "route_seed": s.route_seed,
            "previous_trips": s.table_trips,
            "trip_seeds": f"{first}..{last}",
            "entries": len(json.loads(table.read_text())["entries"]),
        }
    return {
        **s.started,
        "profile": s.profile,
        "diagnostic": s.diagnostic,
        "schemes": s.schemes,
        "bulk": {
            "per_size": s.p.per_size,
            "sizes": {"256KB": 262144, "1MB": 1048576, "4MB": 4194304},
            "slot_s": s.slot_s if s.slot_s != int(s.slot_s) else int(s.slot_s),
        },
        "im": {"users": s.users, "messages": s.p.messages, "mean_gap_ms": s.p.gap_ms},
        "phases": s.phases,
        "backlog": {"seconds": s.backlog_s, "path": BACKLOG_PATH, "link_sets": s.link_sets},
        "concurrency": {
            "users": s.conc_counts,
            "seconds": s.conc_s,
            "source_base": CONC_SOURCE_BASE,
            "path": BACKLOG_PATH,
            "link_sets": s.link_sets,
        }
        if s.has("concurrency")
        else None,
        "sweep": {
            "mib": s.sweep_budgets,
            "schemes": s.sweep_list,
            "seconds": s.sweep_s,
            "path": BACKLOG_PATH,
            "link_sets": ["hsr"],
            "flags": "relay and proxy --mem-budget",
        }
        if s.sweep_units
        else None,
        "buffer_bytes": 3000000,
        "load_seed": LOAD_SEED,
        "trip_parallel": s.trip_parallel,
        "segment_trace": s.segment_trace,
        "load_start_s": s.load_start if s.load_start == "auto" else int(s.load_start),
        "failure_table": ft,
        "link_sets": sets,
    }


def description(s: Settings, link_set: str) -> str:
    if link_set == "hsr":
        if s.diagnostic:
            return (
                f"DIAGNOSTIC: polycorn-tracegen {s.preset}, {CARRIERS} carriers, route seed "
                f"{s.route_seed}, trip seeds from {s.trip_seed_base + 1}, slot "
                f"{s.slot_s:g}s, table {s.table}"
            )
        return (
            f"polycorn-tracegen {s.preset}, {CARRIERS} carriers, route seed {s.route_seed}, "
            "held-out trip seeds"
        )
    if link_set == "mahimahi":
        return "Mahimahi LTE driving traces (T-Mobile, Verizon), 30 ms one-way delay, no loss"
    return (
        f"Mahimahi driving traces (AT&T LTE, T-Mobile UMTS), started {DRIVING_STEP_S} s apart "
        "per trip, 30 ms one-way delay, no loss"
    )


def interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def check_inputs(s: Settings) -> None:
    """The release binaries and every Mahimahi trace the link sets replay are there."""
    missing = [b for b in BINARIES if not (s.bin / b).exists()]
    if missing:
        raise BenchError(f"{s.bin}/{missing[0]} missing: run 'make build'")
    for link_set in s.link_sets:
        names = {
            "mahimahi": [f"{n}-LTE-short" for n in ("TMobile", "Verizon")],
            "driving": list(DRIVING_TRACES),
        }.get(link_set, [])
        for n in names:
            for way in ("up", "down"):
                if not (s.mahimahi / f"{n}.{way}").is_file():
                    raise BenchError(f"Mahimahi trace {s.mahimahi}/{n}.{way} is missing")


def run_link_set(s: Settings, b: Bench, link_set: str) -> list[str]:
    """Every trip of ``link_set`` (the failure table learnt first if the hsr set needs
    it and the run has none yet); the trip ids."""
    if link_set == "hsr" and s.table == "previous" and not (b.run / "failure-table.json").exists():
        b.make_table()
    ids = b.trip_ids(link_set)
    if s.trip_parallel == 1:
        for k, tid in enumerate(ids):
            b.run_trip(link_set, k, tid, 0)
        return ids
    # Waves of TRIP_PARALLEL trips, each on its own block of topologies; a
    # failed trip fails the run.
    for w in range(0, len(ids), s.trip_parallel):
        wave = list(enumerate(ids))[w : w + s.trip_parallel]
        log(f"{link_set}: trips {w + 1}-{w + len(wave)} of {len(ids)} at once")
        parallel(
            [
                lambda k=k, tid=tid, ls=link_set, w=w: b.run_trip(ls, k, tid, k - w)  # type: ignore[misc]
                for k, tid in wave
            ]
        )
    return ids


def analyse(s: Settings, run_dir: Path) -> None:
    """bench/polycorn_bench's analysis of the run: results and plots."""
    log(f"analysing {run_dir}")
    s.plots.mkdir(parents=True, exist_ok=True)
    r = s.p.result
    subprocess.run(
        ["uv", "run", "--project", "bench", "--locked", "--quiet", "python", "-m"]
        + ["polycorn_bench.hsr", str(run_dir), "--out", str(s.out / f"{r}.json")]
        + ["--md", str(s.out / f"{r}.md"), "--plots", str(s.plots)],
        cwd=ROOT,
        # Checked at the start: a change during the run is recorded, not refused.
        env={**os.environ, provenance.ALLOW_DIRTY: "1"},
        check=True,
    )
    log(f"results: {s.out}/{r}.json, {s.out}/{r}.md, plots in {s.plots}; raw records in {run_dir}")


def main(argv: Sequence[str] | None = None) -> int:
    # Everything else is the environment's (the docstring); --help prints it.
    argparse.ArgumentParser(
        prog="python -m polycorn_benchrun.hsr",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    if os.geteuid() != 0:
        raise BenchError("must run as root (network namespaces)")
    s = Settings.from_env()
    # The commit the run starts from, refused before hours of work when its results for
    # bench/out would not be clean (HEAD at the end may be later: others work in this tree
    # while a full run takes hours; the results say so).
    s.started = provenance.start(s.out).started()
    check_inputs(s)
    run_dir = s.work / f"run-{s.profile}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    s.out.mkdir(parents=True, exist_ok=True)
    b = Bench(s, run_dir)
    tcp = TcpMem()
    # Both, explicitly: a process started in the background of a non-interactive
    # shell inherits SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    tcp.raise_()
    sets: dict[str, Any] = {}
    try:
        for link_set in s.link_sets:
            ids = run_link_set(s, b, link_set)
            sets[link_set] = {"trips": ids, "description": description(s, link_set)}
    except BaseException:
        b.stopping.set()
        log("interrupted" if sys.exc_info()[0] is KeyboardInterrupt else "tearing down")
        # Every block any trip slot may have used.
        b.all_down(0, s.n_topo * s.trip_parallel)
        raise
    finally:
        tcp.restore()
        b.drop_table_db()
    if not sets:
        raise BenchError("no link set ran")
    (run_dir / "run.json").write_text(json.dumps(run_json(s, b, sets), indent=1) + "\n")
    analyse(s, run_dir)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log(f"ERROR: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
