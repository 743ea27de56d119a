"""Slow-reading passengers against the proxy's memory.

    slow_readers.py --pax-ns NS --cloud-ns NS --url URL --proxy-pid PID \
        --proxy-metrics HOST:PORT [--downloads 300] [--rate 2k] [--seconds 20] \
        [--rss-limit-mib 512] [--expect-refused] [--json PATH]

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
  proxy's life) never exceeded its size: the proxy's budget is hard, every
  connection's floors and fixed overhead are reserved inside it
  (docs/architecture.md, "Flow control and memory");
* the proxy's resident memory stayed below the pod's memory limit
  (``--rss-limit-mib``, 512: charts/polycorn values.yaml), which the budget
  (half of it by default) is sized for;
* with ``--expect-refused`` (more downloads than the budget admits: the
  proxy at its connection cap): some connections were refused (counted in
  ``polycorn_conns_refused_total``, their downloads failed), and every
  passenger connection up at the end has received at least what its reader
  takes at its rate over the run (none was starved);
* afterwards no connection and no budgeted byte is left (bounded wait), and
  a new download completes.

``--json PATH`` writes the measurements for the record, after the commit and
whether the tree was clean (polycorn_harness.provenance: ``make
bench-proxy-memory`` checks the tree before the suite starts and passes its start
on in POLYCORN_BENCH_START).

Prints one line per sample and a verdict; exits 1 on a failed condition.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prom_metric import families

from polycorn_harness import provenance

MIB = 2**20


def netns(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def rate_bytes(rate: str) -> float:
    """curl's --limit-rate (a number with an optional k, m or g suffix) in bytes/s."""
    scale = {"k": 2**10, "m": 2**20, "g": 2**30}.get(rate[-1].lower(), 1)
    return float(rate.rstrip("kKmMgG")) * scale


def received(pax_ns: str) -> dict[str, int]:
    """Bytes each passenger TCP connection has received, by local address:port
    (``ss -tni``: the kernel's count, which curl's rate limit does not hide)."""
    text = subprocess.run(
        [*netns(pax_ns), "ss", "-tniH", "state", "established"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out: dict[str, int] = {}
    local = ""
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            local = fields[2] if len(fields) >= 4 else ""
            continue
        for word in line.split():
            if word.startswith("bytes_received:") and local:
                out[local] = int(word.split(":", 1)[1])
    return out


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
    ap.add_argument("--expect-refused", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    return run(a)


def record(
    path: Path,
    prov: provenance.Run,
    measured: dict[str, object],
    checks: list[tuple[str, bool]],
) -> None:
    """The measurements as JSON, after the commit and whether the tree was clean."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        **prov.fields(),
        **measured,
        "checks": [{"what": what, "ok": ok} for what, ok in checks],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")


def run(a: argparse.Namespace) -> int:
    prov = provenance.start(*([a.json] if a.json else []))
    before = rss_bytes(a.proxy_pid)
    m0 = scrape(a.cloud_ns, a.proxy_metrics)
    budget = m0["polycorn_mem_budget_bytes{level=high}"]
    refused0 = m0.get("polycorn_conns_refused_total", 0.0)
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
        running = [c.poll() is None for c in curls]
        last = received(a.pax_ns)
        refused = (
            scrape(a.cloud_ns, a.proxy_metrics).get("polycorn_conns_refused_total", 0.0) - refused0
        )
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

    # Everything back: a new download completes.
    fresh = subprocess.run(
        [
            *netns(a.pax_ns),
            "curl",
            "-fsS",
            "--max-time",
            "30",
            "-r",
            "0-1048575",
            "-o",
            "/dev/null",
            a.url,
        ],
        capture_output=True,
        check=False,
    )
    limit = a.rss_limit_mib * MIB
    n = a.downloads
    # Every passenger connection up at the end must have received at least
    # what its reader took at its rate over the whole run: none was starved.
    need = rate_bytes(a.rate) * a.seconds
    still = list(last)
    served = [k for k in still if last[k] >= need]
    ended = n - sum(running)
    checks = [
        (
            f"budget peak {peak_used / MIB:.0f} MiB >= half its {budget / MIB:.0f} MiB (pressure)",
            peak_used >= budget / 2,
        ),
        (
            f"the budget's own peak {ever / MIB:.1f} MiB <= its size {budget / MIB:.0f} MiB",
            ever <= budget,
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
        (f"a new download afterwards: curl exit {fresh.returncode}", fresh.returncode == 0),
    ]
    if a.expect_refused:
        checks += [
            (
                f"{refused:.0f} connections refused at the cap ({peak_conns:.0f} served at once)",
                refused > 0,
            ),
            (
                f"{len(served)} of the {len(still)} passenger connections up at the end"
                f" received at least what their reader took ({need / 1024:.0f} KiB)",
                len(still) > 0 and len(served) == len(still),
            ),
            (
                f"{ended} downloads refused ended (at most the {refused:.0f} refused)",
                ended <= refused,
            ),
        ]
    else:
        checks += [
            (f"{ended} of {n} slow downloads ended early (the file outlasts them)", ended == 0),
            (f"{peak_conns:.0f} connections at once (all {n} at the proxy)", peak_conns >= n),
        ]
    if a.json:
        record(
            a.json,
            prov,
            {
                "downloads": n,
                "rate": a.rate,
                "seconds": a.seconds,
                "mem_budget_bytes": budget,
                "budget_peak_bytes": ever,
                "budget_used_peak_sampled_bytes": peak_used,
                "rss_before_bytes": before,
                "rss_peak_bytes": peak_rss,
                "rss_limit_bytes": limit,
                "conns_peak": peak_conns,
                "conns_refused": refused,
                "passenger_conns_up_at_end": len(still),
                "passenger_conns_served_at_end": len(served),
            },
            checks,
        )
    for what, ok in checks:
        print(f"  {'ok' if ok else 'FAILED'}: {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
