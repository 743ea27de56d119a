"""The fault campaign: ``python -m polycorn_chaos --episodes N --seed S``.

Episode i has seed S + i; its plan (plan.py) comes from that seed alone.
An episode: passengers start downloading and chatting; the plan's faults
happen and heal on time, while relay's and proxy's /readyz are probed; then
the invariants are judged (checks.py):

- transfer-intact: a download curl completed has the origin's sha256; a
  failed one failed visibly (curl's exit code);
- chat-intact: every chat message answered with the right reply or failed
  with a reason;
- telemetry-exactly-once: every record the relay emitted is in LinkDB once
  (only records emitted while the spool's disk was full may be missing, and
  no more than the relay counted), nothing extra, nothing in the dead-letter
  topic;
- health-agrees: a relay whose proxy is gone, or whose carriers are all
  down, says 'not ready' (and the proxy likewise without its relay); after
  the faults every component is healthy and ready again, passengers can
  download, the relay's spool is acknowledged again, within bounds
  (a process that stays up but does not recover is wedged);
- process-survives: nothing exits that was not killed, unless it exited
  with an error it reported (dead-and-reported is allowed for the fleet
  services, counted and restarted, as their supervisor would); the relay
  and the proxy carry passengers and may not exit by themselves at all;
- memory-bounded: the RSS of every process stays under a ceiling and does
  not keep growing over its lifetime.

Writes a JSON report (--out) and exits 1 on any violation, printing the
command that replays the failing episode's plan.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polycorn_chaos.checks import (
    TelemetryLedger,
    TripTelemetry,
    Violation,
    check_chat,
    check_rss,
    check_telemetry,
    check_transfers,
    check_unready_during,
)
from polycorn_chaos.plan import KINDS, Fault, Plan, make_plan
from polycorn_chaos.testbed import Settings, Testbed, log
from polycorn_chaos.workload import Passengers, download
from polycorn_harness import ROOT, provenance

# Bounds (seconds). Waits end as soon as their condition holds; the bounds
# only decide when "not yet" becomes a violation.
UNREADY_GRACE_S = 6.0  # a relay notices its proxy (or every carrier) is gone: loud failures
# ... unless a carrier silently drops everything meanwhile: what went over it
# (the peer's FIN or RST) is lost, and the endpoint declares the path dead
# only after its dead_after (10 s, polycorn_core::EndpointConfig) and a ping.
SILENT_GRACE_S = 13.0
RECOVER_S = 90.0  # healthy, ready, passengers served, telemetry acknowledged again
INGEST_S = 90.0  # LinkDB has every record the relay emitted before it was back
# The trainer completes a run after a fault on its path: it waits up to 60 s
# for its database, runs every 30 s, and a run takes seconds.
TRAINER_S = 120.0


# Processes that carry passengers: a train is offline while either is down,
# so neither may exit on its own, even with a clear error.
DATA_PLANE = ("relay", "proxy")


def last_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    return lines[-1][-300:] if lines else "(no output)"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class FaultRecord:
    fault: Fault
    applied_at: float = 0.0  # monotonic
    applied_ms: int = 0
    healed_at: float = 0.0
    healed_ms: int = 0
    error: str = ""
    # A SIGTERM the process did not obey within 15 s (then SIGKILLed).
    escalated: bool = False


@dataclass
class RecoveryWatch:
    """The recovery conditions not yet met after the faults healed (t0, monotonic)."""

    t0: float
    pending: set[str]
    # The trainer's polycorn_trainer_runs_total when recovery began, if a fault hit it.
    trainer_runs0: float | None
    # Seconds after t0 at which each condition held.
    took: dict[str, float] = field(default_factory=dict)
    # Wall ms up to which the relay has emitted everything it will.
    cut_ms: int = 0
    # The relay's polycorn_telemetry_spool_acked_total as first read once it was back.
    acked0: float | None = None

    def met(self, c: str) -> None:
        self.pending.discard(c)
        self.took[c] = round(time.monotonic() - self.t0, 1)


def health_violations(
    records: list[FaultRecord], ready: dict[str, list[tuple[float, bool]]]
) -> list[Violation]:
    """Health agreed with reality during the faults: a relay without its proxy or any
    carrier, and a proxy without its relay, said 'not ready' within the grace."""
    bad: list[Violation] = []
    for r in records:
        k = r.fault.kind
        start, end = r.applied_at, r.healed_at
        silent = any(
            o.fault.kind == "link-drop" and o.applied_at < end and o.healed_at > start
            for o in records
        )
        grace = SILENT_GRACE_S if silent else UNREADY_GRACE_S

        def win(
            who: str, start: float = start, end: float = end, grace: float = grace
        ) -> dict[str, Any]:
            return {"samples": ready[who], "start": start, "end": end, "grace_s": grace}

        if k in ("proxy-kill", "proxy-term"):
            bad += check_unready_during("relay", "its proxy was down", **win("relay"))
        elif k == "links-all-down":
            # The relay sees its interfaces go down (crates/net/src/link.rs);
            # the proxy hears only silence.
            bad += check_unready_during("relay", "every carrier was down", **win("relay"))
            bad += check_unready_during(
                "proxy", "every carrier was down", **win("proxy", grace=SILENT_GRACE_S)
            )
        elif k in ("relay-kill", "relay-term"):
            bad += check_unready_during("proxy", "its relay was down", **win("proxy"))
    return bad


@dataclass
class Campaign:
    tb: Testbed
    trip: TripTelemetry
    ledger: TelemetryLedger = field(default_factory=TelemetryLedger)
    rss: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    dead_letters: int = 0
    # relay's polycorn_telemetry_spool_errors_total as last read (per pid).
    spool_errors_seen: tuple[int, float] = (0, 0.0)
    # Seconds after the faults healed at which each recovery condition held.
    recovery: dict[str, float] = field(default_factory=dict)

    # ---------------------------------------------------------------- faults

    def apply(self, r: FaultRecord) -> None:
        f, tb = r.fault, self.tb
        r.applied_at, r.applied_ms = time.monotonic(), now_ms()
        comp = f.component
        if f.kind.endswith("-kill"):
            tb.kill(comp, signal.SIGKILL)
        elif f.kind.endswith(("-term", "-restart")):
            if not tb.kill(comp, signal.SIGTERM):
                r.escalated = True
                log(f"  {comp} did not stop within 15 s of SIGTERM: SIGKILLed")
        elif f.kind == "link-down":
            tb.link("down", f.carrier)
        elif f.kind == "link-drop":
            tb.link("drop", f.carrier)
        elif f.kind == "links-all-down":
            for c in range(2):
                tb.link("down", c)
        elif f.kind == "spool-full":
            tb.fill_spool(True)
        else:
            raise ValueError(f.kind)
        r.applied_at = time.monotonic()

    def heal(self, r: FaultRecord) -> None:
        f, tb = r.fault, self.tb
        r.healed_at, r.healed_ms = time.monotonic(), now_ms()
        if f.kind.endswith(("-kill", "-term", "-restart")):
            tb.restart(f.component)
        elif f.kind == "link-down":
            tb.link("up", f.carrier)
        elif f.kind == "link-drop":
            tb.link("undrop", f.carrier)
        elif f.kind == "links-all-down":
            for c in range(2):
                tb.link("up", c)
        elif f.kind == "spool-full":
            tb.fill_spool(False)
            r.healed_ms = now_ms()

    # ---------------------------------------------------------------- watching

    def spool_errors(self) -> None:
        """Accumulate the relay's spool errors (its counter restarts with it)."""
        m = self.tb.metrics("relay")
        if m is None:
            return
        v = int(m.get("polycorn_telemetry_spool_errors_total", 0))
        pid = self.tb.procs["relay"].pid
        last_pid, last = self.spool_errors_seen
        delta = v - int(last) if pid == last_pid and v >= last else v
        self.ledger.spool_errors += max(delta, 0)
        self.spool_errors_seen = (pid, float(v))

    def crashes(self, out: list[dict[str, Any]], bad: list[Violation]) -> None:
        """Processes that exited without being killed: recorded, restarted."""
        for name, p in self.tb.procs.items():
            if p.down_on_purpose or p.alive():
                continue
            status = p.exit_status()
            tail = p.tail()
            reported = ("exit code 0" not in status) and (
                p.popen is not None or any(w in tail.lower() for w in ("error", "panick"))
            )
            out.append({"process": name, "status": status, "reported": reported, "log": tail})
            log(f"  {name} exited by itself ({status}); restarting")
            if not reported:
                bad.append(Violation("process-survives", f"{name} exited silently ({status})"))
            elif name in DATA_PLANE:
                bad.append(
                    Violation(
                        "process-survives", f"{name} exited by itself ({status}): {last_line(tail)}"
                    )
                )
            if name == "emu":
                bad.append(Violation("process-survives", f"the link emulator died ({status})"))
                continue
            p.start()

    # ---------------------------------------------------------------- episode

    def episode(self, index: int, seed: int, kinds: tuple[str, ...] | None) -> dict[str, Any]:
        tb = self.tb
        plan: Plan = make_plan(seed, kinds=kinds)
        log(
            f"episode {index} (seed {seed}): "
            + "; ".join(f.describe() for f in plan.faults)
            + f"; {plan.workload.downloaders} downloaders, {plan.workload.chat_users} chat users"
        )
        bad: list[Violation] = []
        crashed: list[dict[str, Any]] = []
        t0 = time.monotonic()
        chat_out = tb.s.work / f"chat-{index}.jsonl"
        pax = Passengers(tb, plan.workload, seed, chat_out)

        records = [FaultRecord(f) for f in plan.faults]
        ready = self.run_faults(records, t0, bad)
        bad += health_violations(records, ready)

        transfers, chat, problems = pax.finish()
        if problems:
            bad.append(Violation("campaign", f"workload: {problems}"))
        t_counts, t_bad = check_transfers(transfers, tb.sums)
        c_counts, c_bad = check_chat(
            chat, plan.workload.chat_users, plan.workload.chat_messages, pax.deadline_ms
        )
        bad += t_bad + c_bad
        self.crashes(crashed, bad)

        recovered_s, cut_ms = self.recover(bad, crashed, plan)
        tele: dict[str, int] = {}
        if cut_ms:
            tele = self.telemetry(cut_ms, bad)
        self.sample_rss()
        dt = time.monotonic() - t0
        verdict = "ok" if not bad else "VIOLATION"
        log(
            f"  episode {index}: {verdict} in {dt:.0f} s; transfers {dict(t_counts)}, "
            f"chat {dict(c_counts)}, recovered in {recovered_s:.1f} s"
        )
        for v in bad:
            log(f"  !! {v}")
        if bad:
            log(f"  reproduce: make chaos CHAOS_SEED={seed} CHAOS_EPISODES=1")
            tb.save_logs(tb.s.work / f"episode-{index}-logs")
        return {
            "index": index,
            "seed": seed,
            "plan": plan.to_json(),
            "faults": [
                {
                    "kind": r.fault.kind,
                    "applied_ms": r.applied_ms,
                    "healed_ms": r.healed_ms,
                    "error": r.error,
                    "term_escalated_to_kill": r.escalated,
                }
                for r in records
            ],
            "seconds": round(dt, 1),
            "transfers": dict(t_counts),
            "chat": dict(c_counts),
            "telemetry": tele,
            "recovered_s": round(recovered_s, 1),
            "recovery": self.recovery,
            "crashes": crashed,
            "violations": [{"invariant": v.invariant, "detail": v.detail} for v in bad],
            "reproduce": f"make chaos CHAOS_SEED={seed} CHAOS_EPISODES=1",
        }

    def run_faults(
        self, records: list[FaultRecord], t0: float, bad: list[Violation]
    ) -> dict[str, list[tuple[float, bool]]]:
        """Apply and heal each fault on time (seconds after t0), sampling relay's and
        proxy's /readyz meanwhile: those samples, (monotonic time, ready), per process."""
        timeline = sorted(
            [(r.fault.start_s, 0, i) for i, r in enumerate(records)]
            + [(r.fault.end_s, 1, i) for i, r in enumerate(records)]
        )
        ready: dict[str, list[tuple[float, bool]]] = {"relay": [], "proxy": []}
        last_err_read = 0.0
        for at, heal, i in timeline:
            while time.monotonic() - t0 < at:
                for who, samples in ready.items():
                    samples.append((time.monotonic(), self.tb.ready(who)))
                if time.monotonic() - last_err_read > 1.0:
                    self.spool_errors()
                    last_err_read = time.monotonic()
                time.sleep(0.2)
            self.apply_or_heal(records[i], bool(heal), bad)
        self.spool_errors()
        for r in records:
            if r.fault.kind == "spool-full":
                self.ledger.lost_windows.append((r.applied_ms - 1500, r.healed_ms + 2500))
        return ready

    def apply_or_heal(self, r: FaultRecord, heal: bool, bad: list[Violation]) -> None:
        """One step of the timeline; a step that fails is a violation, not the end."""
        try:
            if heal:
                self.heal(r)
                log(f"  healed {r.fault.kind}")
            else:
                if r.fault.kind == "spool-full":
                    self.spool_errors()
                self.apply(r)
                log(f"  applied {r.fault.kind}")
        except Exception as e:
            r.error = f"{type(e).__name__}: {e}"
            log(f"  {'heal' if heal else 'apply'} {r.fault.kind} failed: {r.error}")
            bad.append(
                Violation(
                    "campaign",
                    f"could not {'heal' if heal else 'apply'} {r.fault.kind}: {r.error}",
                )
            )

    def recover(
        self, bad: list[Violation], crashed: list[dict[str, Any]], plan: Plan
    ) -> tuple[float, int]:
        """Wait until everything works again: (seconds it took, the wall ms up to which
        the relay has emitted everything it will: when it was back and ready, less 2 s)."""
        tb = self.tb
        t0 = time.monotonic()
        for name in sorted(tb.infra_down):
            try:
                tb.restart(name)  # a heal that failed: the supervisor tries again
            except Exception as e:
                bad.append(Violation("health-agrees", f"{name} does not start again: {e}"))
        trainer_hit = any(f.component in ("trainer", "pg", "kafka") for f in plan.faults)
        w = RecoveryWatch(
            t0=t0,
            pending={
                "relay healthy and ready",
                "proxy healthy and ready",
                "ingest serves /metrics",
                "trainer serves /metrics",
                "a passenger download succeeds",
                "the relay's spool is acknowledged again",
            },
            trainer_runs0=self._trainer_runs() if trainer_hit else None,
        )
        if trainer_hit:
            w.pending.add("the trainer completes a run")

        deadline = t0 + max(RECOVER_S, TRAINER_S if trainer_hit else 0)
        while w.pending and time.monotonic() < deadline:
            self.crashes(crashed, bad)
            self.poll_services(w)
            self.poll_flows(w, bad)
            if w.pending:
                time.sleep(0.5)
        for c in sorted(w.pending):
            bad.append(
                Violation(
                    "health-agrees",
                    f"not recovered within {deadline - t0:.0f} s after the faults healed: {c}",
                )
            )
            if c.startswith(("relay", "proxy")):
                who = c.split()[0]
                h, r = tb.healthy(who), tb.ready(who)
                log(f"  {who}: alive {tb.procs[who].alive()}, /healthz {h}, /readyz {r}")
        self.spool_errors()
        self.recovery = w.took
        return time.monotonic() - t0, w.cut_ms

    def poll_services(self, w: RecoveryWatch) -> None:
        """Processes answer again: relay and proxy healthy and ready, ingest and trainer
        serve their metrics."""
        tb = self.tb
        for who in ("relay", "proxy"):
            c = f"{who} healthy and ready"
            if c in w.pending and tb.healthy(who) and tb.ready(who):
                w.met(c)
                if who == "relay":
                    w.cut_ms = now_ms() - 2000
        for who in ("ingest", "trainer"):
            c = f"{who} serves /metrics"
            if c in w.pending and tb.metrics(who) is not None:
                w.met(c)

    def poll_flows(self, w: RecoveryWatch, bad: list[Violation]) -> None:
        """Work flows again: passengers download, telemetry is acknowledged, the trainer
        completes a run."""
        tb = self.tb
        relay_back = "relay healthy and ready" not in w.pending
        c = "a passenger download succeeds"
        if c in w.pending and relay_back:
            t = download(tb, "10.66.0.2", "1MiB.bin", max_time_s=20)
            if t.exit_code == 0:
                _, tb_bad = check_transfers([t], tb.sums)
                bad += tb_bad
                w.met(c)
        # Records flow again (relay -> proxy -> Kafka -> acknowledgement).
        # Not "the spool is empty": samples arrive every second, so under
        # load a few are always in flight. That every record reaches
        # LinkDB is the telemetry check's business.
        c = "the relay's spool is acknowledged again"
        if c in w.pending and relay_back:
            m = tb.metrics("relay")
            acked = None if m is None else m.get("polycorn_telemetry_spool_acked_total")
            if acked is not None and w.acked0 is None:
                w.acked0 = acked
            elif acked is not None and w.acked0 is not None and acked > w.acked0:
                w.met(c)
        c = "the trainer completes a run"
        if c in w.pending:
            runs = self._trainer_runs()
            if runs is not None and (w.trainer_runs0 is None or runs > w.trainer_runs0):
                w.met(c)

    def _trainer_runs(self) -> float | None:
        m = self.tb.metrics("trainer")
        return None if m is None else m.get("polycorn_trainer_runs_total", 0.0)

    def telemetry(self, cut_ms: int, bad: list[Violation]) -> dict[str, int]:
        tb = self.tb
        deadline = time.monotonic() + INGEST_S
        while True:
            ho, fx = tb.linkdb_rows()
            probe = TelemetryLedger(
                lost_windows=self.ledger.lost_windows, spool_errors=self.ledger.spool_errors
            )
            _, pbad = check_telemetry(self.trip, ho, fx, cut_ms, probe)
            if not pbad or time.monotonic() > deadline:
                break
            time.sleep(2)
        stats, tbad = check_telemetry(self.trip, ho, fx, cut_ms, self.ledger)
        bad += tbad
        try:
            dl = tb.dead_letters()
        except Exception as e:
            bad.append(Violation("campaign", f"could not read the dead-letter topic: {e}"))
        else:
            if dl > self.dead_letters:
                bad.append(
                    Violation(
                        "telemetry-exactly-once",
                        f"{dl - self.dead_letters} record(s) went to the dead-letter topic",
                    )
                )
            self.dead_letters = dl
        stats["spool errors counted"] = self.ledger.spool_errors
        return stats

    def sample_rss(self) -> None:
        for name, (pid, rss) in self.tb.rss().items():
            self.rss.setdefault((name, pid), []).append(rss)

    def memory_violations(self) -> list[Violation]:
        out: list[Violation] = []
        for (name, pid), samples in self.rss.items():
            out += check_rss(name, pid, samples)
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn-chaos", description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=1, help="episode i has seed SEED + i")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "chaos.json")
    p.add_argument(
        "--kinds",
        default="",
        help=f"comma-separated fault kinds to draw from (default all: {','.join(KINDS)})",
    )
    p.add_argument("--prefix", default=os.environ.get("CHAOS_PREFIX", "ch"))
    p.add_argument(
        "--tree",
        type=Path,
        default=Path(os.environ.get("CHAOS_TREE", ROOT)),
        help="tree whose scripts, target/release and .venv run (default: this one)",
    )
    p.add_argument(
        "--work", type=Path, default=Path(os.environ.get("CHAOS_WORK", "/tmp/polycorn-chaos"))
    )
    p.add_argument("--keep", action="store_true", help="leave the testbed up at the end")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("polycorn-chaos: must run as root (network namespaces)", file=sys.stderr)
        return 2
    kinds = tuple(k for k in a.kinds.split(",") if k) or None
    for k in kinds or ():
        if k not in KINDS:
            p.error(f"unknown fault kind {k!r}")
    # The trip must outlast the campaign: about a minute an episode, and margin.
    # CHAOS_* variables (Settings.from_env) for ports and the infra directory.
    s = replace(
        Settings.from_env(),
        prefix=a.prefix,
        tree=a.tree.resolve(),
        work=a.work,
        trip_s=max(900, a.episodes * 90 + 600),
    )
    # The code that runs is the tree's (its scripts, binaries and environment).
    prov = provenance.start(a.out, root=s.tree)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    report = run_campaign(s, a.episodes, a.seed, kinds, keep=a.keep, out=a.out, prov=prov)
    print(summary(report))
    print(f"report: {a.out}")
    return 0 if report["violations"] == 0 else 1


def run_campaign(
    s: Settings,
    episodes: int,
    seed: int,
    kinds: tuple[str, ...] | None,
    *,
    keep: bool = False,
    out: Path | None = None,
    prov: provenance.Run | None = None,
) -> dict[str, Any]:
    """Bring the testbed up, run the episodes, take it down; the report (also
    written to ``out`` after every episode, so a stopped campaign leaves one, with
    ``prov``'s commit and whether the tree was clean)."""
    prov = prov or provenance.start(*([out] if out else []), root=s.tree)
    tb = Testbed(s)
    results: list[dict[str, Any]] = []
    extra: list[Violation] = []
    started = time.monotonic()
    camp: Campaign | None = None
    try:
        tb.up()
        camp = Campaign(tb, TripTelemetry.load(s.work / "trip" / "events.jsonl", tb.epoch_ms))
        for i in range(episodes):
            results.append(camp.episode(i, seed + i, kinds))
            if out is not None:
                write(out, prov.stamp(report(seed, episodes, results, [], started)))
        extra = camp.memory_violations()
        for v in extra:
            log(f"!! {v}")
    except KeyboardInterrupt:
        # Stopped by hand: the episodes so far are the report.
        log(f"interrupted after {len(results)} episodes")
        if camp is not None:
            extra = camp.memory_violations()
    except Exception:
        tb_txt = traceback.format_exc()
        log(tb_txt)
        extra.append(Violation("campaign", tb_txt.strip().splitlines()[-1]))
        if tb.procs:
            tb.save_logs(s.work / "campaign-error-logs")
    finally:
        if not keep:
            tb.down()
    final = prov.stamp(report(seed, episodes, results, extra, started))
    if out is not None:
        write(out, final)
    return final


def write(out: Path, rep: dict[str, Any]) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rep, indent=1) + "\n")
    tmp.replace(out)


def report(
    seed: int,
    episodes: int,
    results: list[dict[str, Any]],
    extra: list[Violation],
    started: float,
) -> dict[str, Any]:
    faults: Counter[str] = Counter()
    for r in results:
        faults.update(f["kind"] for f in r["faults"])
    by_inv: Counter[str] = Counter()
    for r in results:
        by_inv.update(v["invariant"] for v in r["violations"])
    by_inv.update(v.invariant for v in extra)
    failing = [r for r in results if r["violations"]]
    return {
        "seed": seed,
        "episodes": len(results),
        "episodes_planned": episodes,
        "seconds": round(time.monotonic() - started, 1),
        "faults": dict(sorted(faults.items())),
        "transfers": dict(sum((Counter(r["transfers"]) for r in results), Counter())),
        "chat": dict(sum((Counter(r["chat"]) for r in results), Counter())),
        "crashes": [
            dict(c, episode=r["index"], seed=r["seed"]) for r in results for c in r["crashes"]
        ],
        "violations": sum(len(r["violations"]) for r in results) + len(extra),
        "violations_by_invariant": dict(by_inv),
        "failing_episodes": [
            {
                "index": r["index"],
                "seed": r["seed"],
                "reproduce": r["reproduce"],
                "violations": r["violations"],
            }
            for r in failing
        ],
        "campaign_violations": [{"invariant": v.invariant, "detail": v.detail} for v in extra],
        "results": results,
    }


def summary(report: dict[str, Any]) -> str:
    lines = [
        f"chaos: {report['episodes']} episodes (seed {report['seed']}) "
        f"in {report['seconds']:.0f} s",
        f"  faults: {report['faults']}",
        f"  transfers: {report['transfers']}; chat: {report['chat']}",
        f"  crashes (dead and reported): {len(report['crashes'])}",
        f"  violations: {report['violations']} {report['violations_by_invariant']}",
    ]
    for f in report["failing_episodes"]:
        lines.append(f"  episode {f['index']} seed {f['seed']}: {f['reproduce']}")
        for v in f["violations"]:
            lines.append(f"    {v['invariant']}: {v['detail']}")
    for v in report["campaign_violations"]:
        lines.append(f"  campaign: {v['invariant']}: {v['detail']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
