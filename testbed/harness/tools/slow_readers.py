"""Slow-reading passengers against the proxy's memory.

    slow_readers.py --pax-ns NS --cloud-ns NS --url URL --proxy-pid PID \
        --proxy-metrics HOST:PORT [--downloads 300] [--rate 2k] [--seconds 20]

Starts DOWNLOADS concurrent ``curl --limit-rate RATE`` downloads of URL in the
passengers' namespace (a large file, so none finishes), and for SECONDS
samples the proxy's resident memory (``/proc/PID/status``) and its memory
budget's metrics. The origin sends as fast as the carriers take it, the
passengers read slowly, so the bytes in between pile up in the relay's and the
proxy's buffers until their budgets stop them. Then the downloads are killed
and the proxy must give every connection and every budgeted byte back.

Passes (exit 0) when:

* the pressure reached the proxy: its budget in use peaked at half its size
  or more (otherwise the run proves nothing);
* the budget held: its peak (``polycorn_mem_budget_peak_bytes``, over the
  proxy's life) never exceeded its size plus the floors every connection
  keeps whatever the level (192 KiB each: docs/architecture.md, "Floors,
  so nothing deadlocks"), for the most connections seen at once;
* the proxy's resident memory stayed below the chart's memory limit for the
  proxy pod (``--rss-limit-mib``, 512: charts/polycorn values.yaml), which
  the budget (half of it by default) is sized for;
* afterwards no connection and no budgeted byte is left (bounded wait).

Prints one line per sample and a verdict; exits 1 on a failed condition.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prom_metric import families

MIB = 2**20
# What each connection may hold past the budget's `high` level: its minimum
# window (64 KiB) and its send-buffer floor (128 KiB), crates/core/src/conn.rs.
FLOOR_BYTES = 192 * 1024


def netns(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def scrape(cloud_ns: str, addr: str) -> dict[str, float]:
    """The proxy's samples by name, summed over labels, and by `name{label=value}`."""
    text = subprocess.run(
        [*netns(cloud_ns), "curl", "-fsS", "--max-time", "5", f"http://{addr}/metrics"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out: dict[str, float] = {}
    for fam in families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
            for k, v in s.labels.items():
                key = f"{s.name}{{{k}={v}}}"
                out[key] = out.get(key, 0.0) + float(s.value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pax-ns", required=True)
    ap.add_argument("--cloud-ns", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--proxy-pid", type=int, required=True)
    ap.add_argument("--proxy-metrics", required=True)
    ap.add_argument("--downloads", type=int, default=300)
    ap.add_argument("--rate", default="2k")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rss-limit-mib", type=float, default=512.0)
    a = ap.parse_args()

    before = rss_bytes(a.proxy_pid)
    m0 = scrape(a.cloud_ns, a.proxy_metrics)
    budget = m0["polycorn_mem_budget_bytes{level=high}"]
    curls = [
        subprocess.Popen(
            [*netns(a.pax_ns), "curl", "-sS", "--limit-rate", a.rate, "-o", "/dev/null", a.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(a.downloads)
    ]
    peak_rss, peak_used, peak_conns = before, 0.0, 0.0
    try:
        end = time.monotonic() + a.seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            m = scrape(a.cloud_ns, a.proxy_metrics)
            rss = rss_bytes(a.proxy_pid)
            peak_rss = max(peak_rss, rss)
            peak_used = max(peak_used, m["polycorn_mem_budget_used_bytes"])
            peak_conns = max(peak_conns, m["polycorn_conn_active"])
            used = m["polycorn_mem_budget_used_bytes"]
            conns = m["polycorn_conn_active"]
            print(f"  rss {rss / MIB:.0f} MiB, budget used {used / MIB:.0f}", end="")
            print(f" of {budget / MIB:.0f} MiB, {conns:.0f} connections")
        finished = sum(c.poll() is not None for c in curls)
    finally:
        for c in curls:
            c.kill()
        for c in curls:
            c.wait()
    # Bounded wait for the proxy to let go of every connection and byte.
    give_up = time.monotonic() + 60
    while True:
        m = scrape(a.cloud_ns, a.proxy_metrics)
        left_conns, left_used = m["polycorn_conn_active"], m["polycorn_mem_budget_used_bytes"]
        ever = m["polycorn_mem_budget_peak_bytes"]
        if (left_conns == 0 and left_used == 0) or time.monotonic() > give_up:
            break
        time.sleep(0.5)

    limit = a.rss_limit_mib * MIB
    n = a.downloads
    checks = [
        (f"{finished} of {n} slow downloads ended early (the file outlasts them)", finished == 0),
        (f"{peak_conns:.0f} connections at once (all {n} at the proxy)", peak_conns >= n),
        (
            f"budget peak {peak_used / MIB:.0f} MiB >= half its {budget / MIB:.0f} MiB (pressure)",
            peak_used >= budget / 2,
        ),
        (
            f"the budget's own peak {ever / MIB:.1f} MiB <= its size {budget / MIB:.0f} MiB"
            f" + {peak_conns:.0f} connections' floors ({peak_conns * FLOOR_BYTES / MIB:.0f} MiB)",
            ever <= budget + peak_conns * FLOOR_BYTES,
        ),
        (
            f"proxy rss peak {peak_rss / MIB:.0f} MiB (from {before / MIB:.0f})"
            f" < the pod limit {a.rss_limit_mib:.0f} MiB",
            peak_rss < limit,
        ),
        (
            f"afterwards {left_conns:.0f} connections and {left_used:.0f} budgeted bytes left",
            left_conns == 0 and left_used == 0,
        ),
    ]
    for what, ok in checks:
        print(f"  {'ok' if ok else 'FAILED'}: {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
