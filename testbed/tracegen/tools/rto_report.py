#!/usr/bin/env python3
"""Summarises the item-12 TCP runs of scripts/validate-tracegen.sh (hsr-facts §15.8
item 12, PC §2.2: "1.8% of TCP packets experience an RTO; 24% of those are
retransmitted more than once", BBR iPerf on the PC gateway).

Usage: rto_report.py WORK_DIR FLEET_DIR SECONDS CC
WORK_DIR holds, per run PREFIX = pcv<trip>c<carrier>: PREFIX.json (iperf3 -J),
PREFIX.nstat (nstat -asz --json of the sender's namespace), PREFIX.poll
(tcp_rto_poll.py). FLEET_DIR holds the trips (r1-t<trip>/events.jsonl).

Metrics, per carrier, pooled over trips (definitions in docs/hsr-model.md):
  share  = (TcpExtTCPTimeouts + TcpExtTCPSlowStartRetrans) / data segments sent:
           segments the sender retransmitted because of a retransmission timeout,
           i.e. the timer's own retransmission plus every retransmission in the
           Loss state that follows it, per data segment.
  multi  = RTO episodes whose timer fired >= 2 times before the head segment was
           acknowledged / RTO episodes (tcpi_total_rto and
           tcpi_total_rto_recoveries, polled every 20 ms).
"""

import glob
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def nstat_counters(path):
    d = load(path)
    # nstat --json nests the counters under "kernel".
    return d.get("kernel", d)


def failures_in(events_path, carrier, until_ms):
    n = {2: 0, 3: 0}
    dark = 0
    with open(events_path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") != "handover_end" or e.get("carrier") != carrier:
                continue
            start = e["t_ms"] - e["duration_ms"]
            if start < until_ms and e["ho_type"] in (2, 3):
                n[e["ho_type"]] += 1
                dark += e["duration_ms"]
    return n, dark


def main():
    work, fleet, secs, cc = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    per = {}
    notes = []
    for poll in sorted(glob.glob(os.path.join(work, "pcv*.poll"))):
        prefix = os.path.basename(poll)[: -len(".poll")]
        m = re.fullmatch(r"pcv(\d+)c(\d+)", prefix)
        if not m:
            continue
        trip, carrier = int(m.group(1)), int(m.group(2))
        try:
            p = load(poll)
            ns = nstat_counters(os.path.join(work, prefix + ".nstat"))
            ip = load(os.path.join(work, prefix + ".json"))
        except (OSError, ValueError) as e:
            notes.append(f"{prefix}: incomplete ({e})")
            continue
        if not p["sockets"]:
            notes.append(f"{prefix}: no data socket seen")
            continue
        s = max(p["sockets"], key=lambda x: x["data_segs_out"])
        fails, dark = failures_in(os.path.join(fleet, f"r1-t{trip}", "events.jsonl"), carrier, (secs + 2) * 1000)
        a = per.setdefault(carrier, {k: 0 for k in (
            "segs", "timeouts", "ss_retrans", "retrans", "episodes", "multi", "rto", "rec", "rto_time",
            "bytes", "fail2", "fail3", "dark", "runs", "spurious", "tlp")})
        a["segs"] += s["data_segs_out"]
        a["timeouts"] += ns.get("TcpExtTCPTimeouts", 0)
        a["ss_retrans"] += ns.get("TcpExtTCPSlowStartRetrans", 0)
        a["retrans"] += ns.get("TcpRetransSegs", 0)
        a["spurious"] += ns.get("TcpExtTCPSpuriousRTOs", 0)
        a["tlp"] += ns.get("TcpExtTCPLossProbes", 0)
        a["episodes"] += s["episodes_polled"]
        a["multi"] += s["episodes_multi_rto"]
        a["rto"] += s["total_rto"]
        a["rec"] += s["total_rto_recoveries"]
        a["rto_time"] += s["total_rto_time_ms"]
        a["bytes"] += ip.get("end", {}).get("sum_received", {}).get("bytes", 0)
        a["fail2"] += fails[2]
        a["fail3"] += fails[3]
        a["dark"] += dark
        a["runs"] += 1
        if not p["kernel_ok"]:
            notes.append(f"{prefix}: tcp_info lacks the RTO fields (kernel < 6.7): multi-RTO share unavailable")
    label = "BBR" if cc == "bbr" else f"{cc.upper()} (FALLBACK: BBR not available in this kernel)"
    print()
    print(f"== item 12: {label} iperf3 -R (downlink) through polycorn-emu, pc-gateway-300 route 1,"
          f" first {secs} s of trips 1..{max((v['runs'] for v in per.values()), default=0)}, one flow per carrier,"
          " 4 MB droptail buffer")
    print(f"{'check (hsr-facts §15.8 item)':<34} {'c':>5}  {'published':<38} generated")
    for c in sorted(per):
        a = per[c]
        name = f"c{c}/{'AB'[c % 2]}"
        rto_segs = a["timeouts"] + a["ss_retrans"]
        share = 100.0 * rto_segs / max(a["segs"], 1)
        multi = 100.0 * a["multi"] / max(a["episodes"], 1)
        goodput = a["bytes"] * 8 / 1e6 / max(secs * a["runs"], 1)
        print(f"{'12 RTO-retransmitted segments':<34} {name:>5}  {'1.8% of packets (PC §2.2, §5)':<38} "
              f"{share:.2f}% ({rto_segs} of {a['segs']} data segments: {a['timeouts']} timer + "
              f"{a['ss_retrans']} Loss-state retransmissions)")
        print(f"{'12 multi-RTO share':<34} {name:>5}  {'24% of RTO packets (PC §2.2, §5)':<38} "
              f"{multi:.0f}% of {a['episodes']} RTO episodes had >= 2 timer firings "
              f"(tcp_info: {a['rto']} firings, {a['rec']} recoveries)")
        print(f"{'12 context':<34} {name:>5}  {'':<38} {a['fail2']}+{a['fail3']} failed HOs (II+III), "
              f"{a['dark'] / 1000:.1f} s failure blackout; all retransmissions {a['retrans']} "
              f"({100.0 * a['retrans'] / max(a['segs'], 1):.2f}%); spurious RTOs {a['spurious']}; "
              f"TLPs {a['tlp']}; {a['rto_time'] / 1000:.1f} s in RTO recovery; goodput {goodput:.2f} Mbit/s")
    for n in notes:
        print(f"note: {n}")
    print("definitions: share = (TcpExtTCPTimeouts + TcpExtTCPSlowStartRetrans) / tcpi_data_segs_out of the"
          " sender; multi = RTO episodes (tcpi_total_rto_recoveries) whose retransmission timer fired again"
          " before the head was acknowledged (polled tcpi_total_rto every 20 ms). PC counts packets, not"
          " episodes: see docs/hsr-model.md.")


if __name__ == "__main__":
    main()
