#!/usr/bin/env python3
"""Summarise the raw records of polycorn_benchrun.dataplane (make bench-dataplane) into
bench/out/dataplane.json and a human table, bench/out/dataplane.md.

usage: report.py --raw RAW.jsonl --meta META.json --decision DECISION.json
                 --provenance PROVENANCE.json --json OUT.json --md OUT.md

Every measurement is repeated; each number is the median over the
repetitions, with min and max. Ratios are paired: computed within one
repetition (the schemes of a repetition run back to back), then the median
of those. Exits 1 when a headline number is missing (a scheme failed every
time); the files are written anyway. PROVENANCE.json holds the fields of
polycorn_harness.provenance (commit, clean, ...) the driver took when the run ended: the
JSON starts with them and the table states them.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

# The harness's provenance helper is standard library only, like this script.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed" / "harness"))
from polycorn_harness.provenance import describe  # noqa: E402

Record = dict[str, Any]
Stat = dict[str, Any]

THROUGHPUT_SCHEMES = [
    "direct",
    "relay_1",
    "relay_2",
    "relay_4",
    "quic_2",
    "kernel_mptcp",
    "mptcp_raw",
]
LATENCY_SCHEMES = [
    "direct",
    "origin_local",
    "relay_1",
    "relay_2",
    "relay_4",
    "quic_2",
    "kernel_mptcp",
]
DIRS = ["down", "up"]
# (numerator, denominator) throughput ratios.
RATIOS = [
    ("relay_1", "direct"),
    ("relay_2", "direct"),
    ("relay_4", "direct"),
    ("kernel_mptcp", "direct"),
    ("mptcp_raw", "direct"),
    ("relay_2", "kernel_mptcp"),
    ("quic_2", "relay_2"),
    ("relay_2", "relay_1"),
    ("relay_4", "relay_1"),
    ("kernel_mptcp", "mptcp_raw"),
]
DEFINITIONS = {
    "direct": "one plain TCP connection train -> cloud over carrier 0's veth (iperf3 client in the train "
    "namespace, server on 10.77.0.2); no relay, no TLS, kernel only",
    "relay_k": "passenger namespace -> relay-agent (transparent capture, scheduler minrtt, TLS subflows over "
    "the first k carriers) -> proxy -> origin 10.99.0.10:5201 in the cloud namespace",
    "quic_2": "relay_2 with --transport quic on both ends: a QUIC subflow per carrier (quinn, the railway "
    "controller, the relay's pacer) instead of TLS over TCP",
    "kernel_mptcp": "the same relay-agent/proxy pair with --transport kernel-mptcp on both ends: one MPTCP "
    "connection (TLS inside) whose subflows the kernel schedules",
    "mptcp_raw": "mptcpize run iperf3, train -> cloud 10.77.0.2 over the carriers, no relay (kernel MPTCP "
    "reference)",
    "origin_local": "echo round trips inside the cloud namespace to 10.99.0.10:7 (no veth, no relay): the "
    "floor set by the Python echo server and client",
    "down": "origin -> passenger (iperf3 -R)",
    "up": "passenger -> origin",
}


def stat(values: list[float], digits: int = 3) -> Optional[Stat]:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
        "runs": [round(v, digits) for v in values],
    }


def median(s: Optional[Stat]) -> Optional[float]:
    return None if s is None else s["median"]


def load_jsonl(path: str) -> list[Record]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ok(r: Record) -> bool:
    return not r.get("error")


# A stall: consecutive iperf3 intervals (100 ms) that moved nothing, lasting
# at least this long. Shorter gaps are ordinary burstiness (kernel MPTCP
# shows many single empty intervals); the relay's lost wake-ups last ~1 s.
STALL_MIN_MS = 300


def stalls(intervals: list[list[int]]) -> tuple[float, float]:
    """(seconds spent in stalls, longest stall in seconds) of one run;
    intervals are [milliseconds, bytes] pairs."""
    total = longest = run = 0
    for ms, nbytes in intervals + [[0, 1]]:
        if nbytes == 0:
            run += ms
            continue
        if run >= STALL_MIN_MS:
            total += run
            longest = max(longest, run)
        run = 0
    return total / 1000, longest / 1000


def with_stalls(r: Record) -> Record:
    """The record with stall figures instead of its interval list."""
    out = {k: v for k, v in r.items() if k != "intervals"}
    if r.get("intervals") and r.get("bytes"):
        ivs: list[list[int]] = r["intervals"]
        stalled, longest = stalls(ivs)
        wall = sum(ms for ms, _ in ivs) / 1000
        out["stalled_s"] = round(stalled, 2)
        out["longest_stall_s"] = round(longest, 2)
        out["moving_bits_per_second"] = (
            sum(b for _, b in ivs) * 8 / (wall - stalled) if wall - stalled > 0 else None
        )
    return out


def by_rep(records: list[Record], field: str) -> dict[int, float]:
    return {r["rep"]: float(r[field]) for r in records if ok(r) and r.get(field) is not None}


def throughput_section(recs: list[Record]) -> dict[str, Any]:
    tp = [r for r in recs if r["kind"] == "throughput"]

    def runs(scheme: str, d: str) -> list[Record]:
        return [r for r in tp if r["scheme"] == scheme and r["dir"] == d]

    detail: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    busy: dict[str, Any] = {}
    for s in THROUGHPUT_SCHEMES:
        detail[s], cpu[s], busy[s] = {}, {}, {}
        for d in DIRS:
            good = [r for r in runs(s, d) if ok(r) and r.get("bytes")]
            st = stat([r["bits_per_second"] / 1e9 for r in good])
            if st is not None:
                st["subflows"] = [r.get("subflows") for r in good]
                st["stalled_s"] = stat([float(r.get("stalled_s") or 0) for r in good], 1)
                st["longest_stall_s"] = stat(
                    [float(r.get("longest_stall_s") or 0) for r in good], 1
                )
                moving = [
                    r["moving_bits_per_second"] / 1e9
                    for r in good
                    if r.get("moving_bits_per_second")
                ]
                st["moving_gbps"] = stat(moving)
            detail[s][d] = st
            per_gb: dict[str, Optional[Stat]] = {}
            for who in ["relay", "proxy", "machine"]:
                per_gb[who] = stat(
                    [
                        r[f"{who}_cpu_s"] / (r["bytes"] / 1e9)
                        for r in good
                        if r.get(f"{who}_cpu_s") is not None
                    ]
                )
            both = [
                (r["relay_cpu_s"] + r["proxy_cpu_s"]) / (r["bytes"] / 1e9)
                for r in good
                if r.get("relay_cpu_s") is not None and r.get("proxy_cpu_s") is not None
            ]
            per_gb["relay_plus_proxy"] = stat(both)
            cpu[s][d] = {k: median(v) for k, v in per_gb.items()}
            for who in ["relay", "proxy"]:
                cpu[s][d][f"{who}_ctx_switches_per_mb"] = median(
                    stat(
                        [
                            r[f"{who}_ctx_switches"] / (r["bytes"] / 1e6)
                            for r in good
                            if r.get(f"{who}_ctx_switches") is not None
                        ],
                        1,
                    )
                )
            busy[s][d] = {
                who: median(
                    stat(
                        [
                            r[f"{who}_cpu_s"] / r["wall_s"]
                            for r in good
                            if r.get(f"{who}_cpu_s") is not None
                        ]
                    )
                )
                for who in ["relay", "proxy", "machine"]
            }
    ratios: dict[str, Any] = {}
    for num, den in RATIOS:
        ratios[f"{num}/{den}"] = {}
        for d in DIRS:
            a, b = by_rep(runs(num, d), "bits_per_second"), by_rep(runs(den, d), "bits_per_second")
            ratios[f"{num}/{den}"][d] = stat(
                [a[k] / b[k] for k in sorted(a) if k in b and b[k] > 0]
            )
    return {
        "throughput_gbps": {s: median(detail[s]["down"]) for s in THROUGHPUT_SCHEMES},
        "throughput_gbps_up": {s: median(detail[s]["up"]) for s in THROUGHPUT_SCHEMES},
        "throughput_detail": detail,
        "throughput_ratios": ratios,
        "cpu_seconds_per_gb": cpu,
        "cpu_cores_busy": busy,
    }


def latency_section(recs: list[Record]) -> dict[str, Any]:
    lat = [r for r in recs if r["kind"] == "latency"]
    detail: dict[str, Any] = {}
    for s in LATENCY_SCHEMES:
        mine = [r for r in lat if r["scheme"] == s and ok(r)]
        detail[s] = {
            p: stat([float(r[f"{p}_us"]) for r in mine], 1) for p in ["p50", "p90", "p99", "max"]
        }
    headline = {
        "direct_p50": median(detail["direct"]["p50"]),
        "direct_p99": median(detail["direct"]["p99"]),
        "relay_p50": median(detail["relay_2"]["p50"]),
        "relay_p99": median(detail["relay_2"]["p99"]),
    }
    for s in ["origin_local", "relay_1", "relay_4", "kernel_mptcp"]:
        headline[f"{s}_p50"] = median(detail[s]["p50"])
        headline[f"{s}_p99"] = median(detail[s]["p99"])
    ratios: dict[str, Any] = {}
    for s in ["relay_1", "relay_2", "relay_4", "kernel_mptcp"]:
        a = by_rep([r for r in lat if r["scheme"] == s], "p50_us")
        b = by_rep([r for r in lat if r["scheme"] == "direct"], "p50_us")
        ratios[f"{s}_p50/direct_p50"] = stat(
            [a[k] / b[k] for k in sorted(a) if k in b and b[k] > 0], 2
        )
    return {"latency_us": headline, "latency_detail": detail, "latency_ratios": ratios}


def rss_section(recs: list[Record]) -> dict[str, Any]:
    rss = [r for r in recs if r["kind"] == "rss" and ok(r) and r.get("relay_kb") is not None]
    conns = rss[0]["conns"] if rss else None
    detail: dict[str, Any] = {"conns": conns}
    for who in ["relay", "proxy"]:
        detail[f"{who}_mb_idle"] = stat([r[f"{who}_kb_idle"] / 1024 for r in rss], 1)
        detail[f"{who}_mb"] = stat([r[f"{who}_kb"] / 1024 for r in rss], 1)
        detail[f"{who}_kb_per_conn"] = stat(
            [(r[f"{who}_kb"] - r[f"{who}_kb_idle"]) / r["conns"] for r in rss], 1
        )
    detail["echoed"] = [r.get("echoed") for r in rss]
    detail["proxy_upstreams"] = [r.get("proxy_upstreams") for r in rss]
    detail["open_seconds"] = [r.get("open_seconds") for r in rss]
    return {
        "rss_mb_1000_conns": {
            "relay": median(detail["relay_mb"]),
            "proxy": median(detail["proxy_mb"]),
        },
        "rss_detail": detail,
    }


def fmt(s: Optional[Stat], digits: int = 2) -> str:
    if s is None:
        return "n/a"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def num(v: Optional[float], digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def markdown(out: dict[str, Any]) -> str:
    m = out["meta"]
    st = m["settings"]
    lines = [
        "# Data-plane benchmark",
        "",
        describe(out),
        "",
        f"{m['started']}, "
        f"{m['machine']['cpus']} × {m['machine']['cpu']}, kernel {m['machine']['kernel']}; "
        f"load average {m['loadavg_start']} at start, {m['loadavg_end']} at end.",
        f"Each cell: median (min–max) of {st['reps']} runs of {st['seconds_per_run']} s, schemes interleaved. "
        "Namespace testbed with veth carriers (no delay, no loss): these numbers measure CPU cost, not radio links. "
        "Compare within a run, as ratios; absolute values vary with the machine and its load.",
        "",
        "## Throughput (Gbit/s, iperf3, one TCP stream)",
        "",
        "| scheme | subflows | down (origin → passenger) | up (passenger → origin) |",
        "|---|---|---|---|",
    ]
    detail = out["throughput_detail"]
    for s in THROUGHPUT_SCHEMES:
        d = detail[s]
        subs = sorted({x for dd in DIRS if d[dd] for x in d[dd]["subflows"] if x is not None})
        lines.append(
            f"| {s} | {'/'.join(map(str, subs)) or '?'} | {fmt(d['down'])} | {fmt(d['up'])} |"
        )
    lines += [
        "",
        f"Stalls: seconds per run spent in stalls (≥ {STALL_MIN_MS} ms of consecutive 100 ms iperf3 intervals "
        "that moved nothing), the longest stall, and the rate outside stalls (what the scheme does when it "
        "is not stalled):",
        "",
        "| scheme | stalled s, down | stalled s, up | longest, down | longest, up "
        "| Gbit/s outside stalls, down | Gbit/s outside stalls, up |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in THROUGHPUT_SCHEMES:
        d = detail[s]
        cells = [fmt(d[dd]["stalled_s"], 1) if d[dd] else "n/a" for dd in DIRS]
        cells += [fmt(d[dd]["longest_stall_s"], 1) if d[dd] else "n/a" for dd in DIRS]
        cells += [fmt(d[dd]["moving_gbps"]) if d[dd] else "n/a" for dd in DIRS]
        lines.append(f"| {s} | {' | '.join(cells)} |")
    lines += [
        "",
        "Ratios (paired within each repetition):",
        "",
        "| ratio | down | up |",
        "|---|---|---|",
    ]
    for name, r in out["throughput_ratios"].items():
        lines.append(f"| {name} | {fmt(r['down'])} | {fmt(r['up'])} |")
    lines += [
        "",
        "## CPU per GB moved (CPU seconds / 10⁹ bytes; medians)",
        "",
        "relay and proxy: utime+stime of the process (all threads) from /proc/PID/stat. machine: busy time of "
        "all CPUs from /proc/stat (kernel network stack, iperf3 ends, and any other load on the machine). "
        "cores busy: CPU seconds per wall-clock second during the run. "
        "ctx sw/MB: context switches of all the process's threads (/proc/PID/task/*/status) per 10⁶ bytes.",
        "",
        "| scheme | dir | relay | proxy | relay+proxy | machine | relay cores busy | proxy cores busy "
        "| relay ctx sw/MB | proxy ctx sw/MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in THROUGHPUT_SCHEMES:
        for d in DIRS:
            c, b = out["cpu_seconds_per_gb"][s][d], out["cpu_cores_busy"][s][d]
            lines.append(
                f"| {s} | {d} | {num(c['relay'])} | {num(c['proxy'])} | {num(c['relay_plus_proxy'])} | "
                f"{num(c['machine'])} | {num(b['relay'])} | {num(b['proxy'])} | "
                f"{num(c['relay_ctx_switches_per_mb'], 1)} | {num(c['proxy_ctx_switches_per_mb'], 1)} |"
            )
    lines += [
        "",
        f"## Request/response latency ({st['round_trips']} sequential 100-byte echo round trips on one connection, µs)",
        "",
        "| path | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for s in LATENCY_SCHEMES:
        ld = out["latency_detail"][s]
        lines.append(
            f"| {s} | {fmt(ld['p50'], 1)} | {fmt(ld['p90'], 1)} | {fmt(ld['p99'], 1)} | {fmt(ld['max'], 0)} |"
        )
    lines += ["", "| ratio | median (min–max) |", "|---|---|"]
    for name, r in out["latency_ratios"].items():
        lines.append(f"| {name} | {fmt(r)} |")
    rd = out["rss_detail"]
    lines += [
        "",
        f"## Memory with {rd['conns']} idle passenger connections (relay_2, VmRSS, MiB)",
        "",
        "| process | idle (0 connections) | with the connections | per connection (KiB) |",
        "|---|---|---|---|",
    ]
    for who in ["relay", "proxy"]:
        lines.append(
            f"| {who} | {fmt(rd[f'{who}_mb_idle'], 1)} | {fmt(rd[f'{who}_mb'], 1)} | {fmt(rd[f'{who}_kb_per_conn'], 1)} |"
        )
    lines += [
        "",
        "## Scheduler decisions (criterion, median ns)",
        "",
        "`select`: one pipeline call; `schedule`: the endpoint's cost per packet placed "
        "(user scheduler, send buffer and view refreshes included).",
        "",
    ]
    by = out["decision_ns_by"]
    if not by:
        lines.append(f"not measured: {out.get('decision_note') or 'no result'}")
    else:
        lines += ["| benchmark | pipeline | 2 paths | 4 paths | 8 paths |", "|---|---|---|---|---|"]
        for group, pipes in by.items():
            for p, ns in pipes.items():
                cells = " | ".join(num(ns.get(k), 1) for k in ("2", "4", "8"))
                lines.append(f"| {group} | `{p}` | {cells} |")
    lines += ["", "## What the schemes are", ""]
    lines += [f"- **{k}**: {v}" for k, v in DEFINITIONS.items()]
    lines.append(
        f"- **kernel_mptcp** and **mptcp_raw** use {st['mptcp_subflows']} subflows (the initial one over carrier 0 "
        "and one per further carrier endpoint), to compare with relay_2."
    )
    if out["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in out["errors"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--decision", required=True)
    ap.add_argument("--provenance", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    args = ap.parse_args()

    recs = [with_stalls(r) for r in load_jsonl(args.raw)]
    with open(args.meta) as f:
        meta = json.load(f)
    with open(args.decision) as f:
        decision: dict[str, Any] = json.load(f)
    with open(args.provenance) as f:
        out: dict[str, Any] = json.load(f)

    out.update(throughput_section(recs))
    out.update(latency_section(recs))
    out.update(rss_section(recs))
    by = {g: v for g, v in decision.items() if g in ("select", "schedule")}
    # decision_ns: select/minrtt, the figure earlier results quote.
    out["decision_ns"] = {n: by.get("select", {}).get("minrtt", {}).get(n) for n in ["2", "4", "8"]}
    out["decision_ns_by"] = by
    if "error" in decision:
        out["decision_note"] = decision["error"]
    out["errors"] = [
        f"{r['kind']} {r.get('scheme', '')} {r.get('dir', '')} rep {r['rep']}: {r['error']}".replace(
            "  ", " "
        )
        for r in recs
        if not ok(r)
    ]
    out["definitions"] = DEFINITIONS
    out["meta"] = meta
    out["raw"] = recs

    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    with open(args.md, "w") as f:
        f.write(markdown(out))

    missing = [f"throughput_gbps.{k}" for k, v in out["throughput_gbps"].items() if v is None]
    missing += [
        f"latency_us.{k}"
        for k in ["direct_p50", "relay_p50", "relay_p99"]
        if out["latency_us"][k] is None
    ]
    missing += [f"rss_mb_1000_conns.{k}" for k, v in out["rss_mb_1000_conns"].items() if v is None]
    for e in out["errors"]:
        print(f"report: error: {e}", file=sys.stderr)
    if missing:
        print(f"report: missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
