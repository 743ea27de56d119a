"""Markdown report and compact plain-text table from an ``hsr.json`` document."""

from __future__ import annotations

from typing import Any

from polycorn_bench import provenance
from polycorn_bench.analysis import HANDOVER_BINS, METHODS, OVERALL
from polycorn_bench.hrsch import HOF_MIN_ACTIVE_MS, HOF_WINDOW_MS, PAPER, REINJECTION_K
from polycorn_bench.verdict import verdict, verdict_text


def _f(x: Any, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _ci(ci: Any) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def _columns(bulk: dict[str, Any]) -> list[str]:
    cols: list[str] = []
    for per in bulk.values():
        for k in per:
            if k not in cols and k != OVERALL:
                cols.append(k)
    return [*cols, OVERALL]


def _ordered_labels(doc: dict[str, Any], bulk: dict[str, Any]) -> list[str]:
    known = list(doc.get("sizes", {}))
    present = _columns(bulk)
    return [k for k in known if k in present] + [k for k in present if k not in known]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _pct(x: Any, digits: int = 1, sign: bool = True) -> str:
    if x is None:
        return "–"
    return f"{x * 100:+.{digits}f} %" if sign else f"{x * 100:.{digits}f} %"


def _pct_ci(ci: Any) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f" [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]"


def _pct_ci_unsigned(ci: Any) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f" [{ci[0] * 100:.2f}, {ci[1] * 100:.2f}]"


def _vs_paper(ci: Any, paper: Any, n: Any, lower_is_better: bool = False) -> str:
    """'' without a paper number; else the verdict of the interval against it, in words (bold
    when below the paper)."""
    v = verdict(ci, paper, n, lower_is_better=lower_is_better)
    text = verdict_text(v)
    return f"**{text}**" if v == "below" else text


def _plain_vs_paper(ci: Any, paper: Any, n: Any, lower_is_better: bool = False) -> str:
    return verdict_text(verdict(ci, paper, n, lower_is_better=lower_is_better))


def _vs_baselines_lines(doc: dict[str, Any], vs: Any) -> list[str]:
    """The HRSCH section's part on hrsch against each baseline."""
    out: list[str] = []
    labels = _ordered_labels(doc, vs)
    out += [
        "**hrsch against each baseline**: geometric mean of the paired goodput ratios "
        "hrsch/baseline [95 % CI of the pairs], n pairs; with two trips or more, the "
        "interval that resamples trips after 'trips'; the paper's number (against minrtt "
        "only) in brackets with the verdict of an interval against it (above / below the "
        "paper: the whole interval above / below its number; consistent: its number "
        "inside), from 10 trips on the trips' interval, else the pairs'.",
        "",
    ]
    rows = []
    for base, per in vs.items():
        row = [f"`{base}`"]
        for lbl in labels:
            s = per.get(lbl)
            if s is None:
                row.append("–")
                continue
            cell = f"{_f(s['ratio'])}{_ci(s['ci95'])}, n {s['n_pairs']}"
            if s.get("ci95_trips"):
                cell += f", trips{_ci(s['ci95_trips'])}"
            if s.get("paper") is not None:
                cell += (
                    f" (paper {s['paper']:.2f}: "
                    f"{_vs_paper(_verdict_ci(s), s['paper'], s['n_pairs'])})"
                )
            row.append(cell)
        rows.append(row)
    out += _table(["hrsch vs", *labels], rows)
    out += [
        "",
        "Ratio of means and arithmetic mean of the ratios (the paper's 'average goodput "
        "ratio'), overall: "
        + "; ".join(
            f"`{b}` {_f(p.get(OVERALL, {}).get('ratio_of_means'))} / "
            f"{_f(p.get(OVERALL, {}).get('mean_of_ratios'))}"
            for b, p in vs.items()
        )
        + ".",
        "",
    ]
    return out


def _ablation_lines(abl: Any) -> list[str]:
    """The HRSCH section's part on the ablation of each mechanism."""
    out = [
        "**Ablation**: goodput gain over minrtt of minrtt plus one HRSCH mechanism (all "
        "sizes pooled; geometric mean of paired ratios − 1 [95 % CI]; ratio of means − 1).",
        "",
    ]
    rows = []
    for scheme, a in abl.items():
        rows.append(
            [
                a["mechanism"],
                f"`{scheme}`",
                str(a["n_pairs"]),
                _pct(a["gain"]) + _pct_ci(a["ci95"]),
                _pct(a["gain_ratio_of_means"]),
                _pct(a["paper_gain"]),
                _vs_paper(a["ci95"], a["paper_gain"], a["n_pairs"]),
            ]
        )
    out += _table(
        [
            "mechanism",
            "scheme",
            "n",
            "gain [95 % CI]",
            "gain (means)",
            "paper",
            "vs the paper",
        ],
        rows,
    )
    out += [
        "",
        "The paper prints the four gains as '7.0 %, 18.8 %, 4.2 % and 2.9 %'; the mapping "
        "to mechanisms (ORI 18.8 %, TPR 4.2 %) is the slides' (hsr-facts §12.3), and its "
        "16 % 'together' is below ORI's own gain.",
        "",
    ]
    return out


def _extra_traffic_lines(extra: Any) -> list[str]:
    """The HRSCH section's part on extra traffic of reinjection and redundancy."""
    out = [
        "**Extra traffic** (whole trips, bulk and IM): reinjected and redundant passenger "
        "bytes (downlink from the proxy's scheduler, uplink from the relay's) per byte "
        "delivered to or taken from the passengers (the relay's capture counters); "
        "duplicates: the share of those extra copies the receiving end already had.",
        "",
    ]
    rows = []
    for scheme, e in extra.items():
        if e is None:
            rows.append([f"`{scheme}`", "–", "–", "–", "–", "–", "–"])
            continue
        rows.append(
            [
                f"`{scheme}`",
                _f(e["goodput_bytes"] / 1e6, 1),
                _f(e["reinjected_bytes"] / 1e6, 2),
                _pct(e["reinjected_share"], 2, sign=False),
                "–" if e["redundant_bytes"] is None else _f(e["redundant_bytes"] / 1e6, 2),
                _pct(e["redundant_share"], 2, sign=False),
                _pct(e.get("duplicate_share_of_extra"), 1, sign=False),
            ]
        )
    out += _table(
        [
            "scheme",
            "goodput MB",
            "reinjected MB",
            "reinjected",
            "redundant MB",
            "redundant",
            "duplicates",
        ],
        rows,
    )
    out.append("")
    null = [s for s, e in extra.items() if e is None]
    if null:
        out += [
            "No counters for "
            + ", ".join(f"`{s}`" for s in null)
            + " (kernel-scheduled, or no usable metrics snapshot).",
            "",
        ]
    return out


def _reinjection_overhead_lines(ls: dict[str, Any], ro: Any) -> list[str]:
    """The HRSCH section's part on the reinjection overhead against the paper."""
    out: list[str] = []
    paper = PAPER["reinjection_overhead"]
    ro_cmp = ls.get("reinjection_overhead_vs_paper") or {}
    out += [
        "**Extended reinjection overhead** (reinjected bytes / goodput bytes, whole trips; "
        "95 % interval from a bootstrap over trips; lower is cheaper, so 'above the paper' "
        "means an interval wholly below the paper's number):",
        "",
    ]
    rows = []
    for k in REINJECTION_K:
        if k not in ro:
            continue
        c = ro_cmp.get(k, {})
        ci, n = c.get("ci95"), c.get("n")
        rows.append(
            [
                k,
                f"`{REINJECTION_K[k]}`",
                _pct(ro[k], 2, sign=False) + _pct_ci_unsigned(ci),
                _pct(paper[k], 1, sign=False),
                _vs_paper(ci, paper[k], n, lower_is_better=True),
            ]
        )
    out += _table(["k", "scheme", "ours [95 % CI]", "paper", "vs the paper"], rows)
    out.append("")
    return out


def _im_lines(im: Any) -> list[str]:
    """The HRSCH section's part on instant messaging against the paper."""
    out: list[str] = []
    paper = PAPER["im_hrsch"]
    out += [
        "**Instant messaging**: relative change of hrsch's delivery time against "
        "single-path and minrtt (negative = hrsch faster / fairer).",
        "",
    ]
    rows = []
    entries = [*im["by_users"].items(), ("average", im["average"]), ("paper", paper)]
    for users, e in entries:
        sp, mr = e.get("vs_single_path", {}), e.get("vs_minrtt", {})
        rows.append(
            [
                users,
                *[_pct(sp.get(k)) for k in ("mean", "p90", "cov")],
                *[_pct(mr.get(k)) for k in ("mean", "p90", "cov")],
            ]
        )
    out += _table(
        [
            "users",
            "mean vs single-path",
            "p90",
            "CoV",
            "mean vs minrtt",
            "p90",
            "CoV",
        ],
        rows,
    )
    avg = im["average"]
    avg_ci = im.get("average_ci95") or {}
    n_trips = im.get("n_trips")
    out += [
        "",
        "The averages against the paper's, with 95 % intervals from a bootstrap over "
        + ("the trips" if n_trips is None else f"{n_trips} trip{'' if n_trips == 1 else 's'}")
        + " (lower is better: 'above the paper' means an interval wholly below the "
        "paper's number):",
        "",
    ]
    rows = []
    for ref in ("vs_single_path", "vs_minrtt"):
        for k in ("mean", "p90", "cov"):
            ci = avg_ci.get(ref, {}).get(k)
            rows.append(
                [
                    ref.removeprefix("vs_").replace("_", "-"),
                    {"mean": "mean", "p90": "p90", "cov": "CoV"}[k],
                    _pct(avg[ref][k]) + _pct_ci(ci),
                    _pct(paper[ref][k], 0),
                    _vs_paper(ci, paper[ref][k], n_trips, lower_is_better=True)
                    if avg[ref][k] is not None
                    else "no data",
                ]
            )
    out += _table(["against", "delay", "hrsch, average [95 % CI]", "paper", "vs the paper"], rows)
    out.append("")
    return out


def _hof_recovery_lines(hof: Any) -> list[str]:
    """The HRSCH section's part on recovery after failed handovers."""
    out: list[str] = []
    paper = PAPER["hof_recovery"]
    out += [
        f"**Recovery after handover failures**: {hof['n_failures']} failed handovers; "
        f"goodput in the {HOF_WINDOW_MS / 1000:g} s from each failure's handover_start of "
        "the download in flight in both schemes, a bulk download or the backlog phase's "
        "always-busy one (bytes received / time active in the "
        f"window; pairs active less than {HOF_MIN_ACTIVE_MS:g} ms dropped), against "
        "minrtt on the same failure and download.",
        "",
    ]
    rows = []
    for scheme, b in hof.get("by_scheme", {}).items():
        rows.append(
            [
                f"`{scheme}`",
                str(b["n"]),
                str(b.get("n_bulk", 0)),
                str(b.get("n_backlog", 0)),
                f"{_f(b['goodput_mbps_mean'])} / {_f(b['minrtt_goodput_mbps_mean'])}",
                f"{_f(b['goodput_mbps_median'])} / {_f(b['minrtt_goodput_mbps_median'])}",
                _f(b["ratio_of_means"]) + _ci(b["ci95"]),
                _f(b["ratio_of_medians"]),
            ]
        )
    out += _table(
        [
            "scheme",
            "n",
            "n bulk",
            "n backlog",
            "mean Mbit/s (scheme / minrtt)",
            "median",
            "ratio of means [95 % CI]",
            "ratio of medians",
        ],
        rows,
    )
    mean_ci = hof.get("hrsch_vs_minrtt_mean_ci95")
    median_ci = hof.get("hrsch_vs_minrtt_median_ci95")
    out += [
        "",
        f"hrsch vs minrtt: ratio of means {_f(hof['hrsch_vs_minrtt_mean'])}{_ci(mean_ci)} "
        f"(paper {paper['hrsch_vs_minrtt_mean']:.1f}: "
        f"{_vs_paper(mean_ci, paper['hrsch_vs_minrtt_mean'], hof['n'])}), "
        f"ratio of medians {_f(hof['hrsch_vs_minrtt_median'])}{_ci(median_ci)} "
        f"(paper {paper['hrsch_vs_minrtt_median']:.1f}: "
        f"{_vs_paper(median_ci, paper['hrsch_vs_minrtt_median'], hof['n'])}), "
        f"n = {hof['n']} ({hof.get('n_bulk', 0)} bulk, {hof.get('n_backlog', 0)} "
        "backlog).",
        "",
    ]
    return out


def _hrsch_section(doc: dict[str, Any], ls: dict[str, Any]) -> list[str]:
    """The HRSCH issue's evidence for one link set; empty when none of it is there."""
    keys = ("hrsch_vs_baselines", "ablation", "im_hrsch", "reinjection_overhead", "hof_recovery")
    notes = ls.get("notes", {})
    extra = ls.get("extra_traffic") or {}
    has_hrsch = any(ls.get(k) for k in keys)
    if not has_hrsch and not extra:
        return []
    if has_hrsch:
        out = [
            "### HRSCH against the paper",
            "",
            f"Paper numbers: {PAPER['source']}. Every comparison is paired (same trip and "
            "download or failure); nothing is tuned to reach them.",
            "",
        ]
    else:
        out = ["### Extra traffic", ""]
    vs = ls.get("hrsch_vs_baselines")
    if vs:
        out += _vs_baselines_lines(doc, vs)
    abl = ls.get("ablation")
    if abl:
        out += _ablation_lines(abl)
    if extra:
        out += _extra_traffic_lines(extra)
    ro = ls.get("reinjection_overhead")
    if ro:
        out += _reinjection_overhead_lines(ls, ro)
    im = ls.get("im_hrsch")
    if im:
        out += _im_lines(im)
    hof = ls.get("hof_recovery")
    if hof:
        out += _hof_recovery_lines(hof)
    for key, text in notes.items():
        if key not in CAPACITY_NOTES:  # with their own sections
            out += [f"*{key}: {text}.*", ""]
    return out


def _r(r: float | None, p: float | None, ci: Any) -> str:
    """A cost ratio and its interval: unbounded (∞) where the threshold p* is 0, and an
    upper bound of None unbounded too."""
    lo, hi = ci or (None, None)
    point = "∞" if r is None and p == 0 else _f(r, 1)
    return f"{point} [{_f(lo, 1)}, {'∞' if hi is None else _f(hi, 1)}]"


def _costs_section(ls: dict[str, Any]) -> list[str]:
    """What a caught failure saves and a needless hold costs (polycorn_bench.costs)."""
    costs = ls.get("handover_costs")
    note = ls.get("notes", {}).get("handover_costs")
    if not costs:
        return [f"*handover_costs: {note}.*", ""] if note else []
    out = [
        "### What a caught failure saves and a needless hold costs",
        "",
        "Each pipeline with no table (@none), the trip's oracle table (@oracle) and the "
        "oracle plus every cell the trip hands over in (@every), side by side; over the "
        "backlog download's window, saved per failure = (oracle − none) bytes / failed "
        "handovers, cost per hold = (oracle − every) bytes / successful handovers, summed "
        "over trips. A cell pays its place in the table above p* = C_hold / (C_fail + "
        "C_hold) = 1 / (1 + r). A held second costs (oracle − every) bytes over the "
        "seconds @every held paths beyond @oracle (hof-reject's held_ms, the proxy's). "
        "[95 %: bootstrap over trips.]",
        "",
    ]
    rows = []
    for p, c in costs.items():
        hold = c["mean_hold_s"]
        rows.append(
            [
                f"`{p}`",
                f"{c['trips']} ({c['failed']} / {c['succeeded']})",
                _f(c["saved_per_failure_mb"])
                + _ci(c["saved_per_failure_mb_ci95"])
                + f" ({_f(c['saved_per_failure_s'], 1)} s)",
                _f(c["cost_per_hold_mb"], 3)
                + _ci(c["cost_per_hold_mb_ci95"])
                + f" ({_f(c['cost_per_hold_s'], 2)} s)",
                _f(c["threshold_p"], 3) + _ci(c["threshold_p_ci95"]),
                _r(c["cost_ratio"], c["threshold_p"], c["cost_ratio_ci95"]),
                _f(c["cost_per_held_second_mb"]) + _ci(c["cost_per_held_second_mb_ci95"]),
                f"{_f(hold['oracle'])} / {_f(hold['every'])}",
            ]
        )
    stall_rows = []
    for p, c in costs.items():
        stall_rows.append(
            [
                f"`{p}`",
                str(c.get("trips_with_stalls", 0)),
                _f(c.get("stall_saved_per_failure_s"))
                + _ci(c.get("stall_saved_per_failure_s_ci95")),
                _f(c.get("stall_cost_per_hold_s"), 3) + _ci(c.get("stall_cost_per_hold_s_ci95")),
                _f(c.get("stall_threshold_p"), 3) + _ci(c.get("stall_threshold_p_ci95")),
                _r(
                    c.get("stall_cost_ratio"),
                    c.get("stall_threshold_p"),
                    c.get("stall_cost_ratio_ci95"),
                ),
            ]
        )
    out += _table(
        [
            "pipeline",
            "trips (failed / successful handovers)",
            "saved per caught failure, MB (s of goodput)",
            "cost per needless hold, MB (s)",
            "threshold p*",
            "r = C_fail / C_hold",
            "cost per held second, MB",
            "mean hold, s (oracle / every)",
        ],
        rows,
    )
    out += [
        "",
        "The same in stall seconds: the time the download received nothing for at least "
        f"{_f(next(iter(costs.values())).get('stall_min_ms'), 0)} ms, after its first byte.",
        "",
    ]
    out += _table(
        [
            "pipeline",
            "trips",
            "stall saved per caught failure, s",
            "stall cost per needless hold, s",
            "threshold p*",
            "r",
        ],
        stall_rows,
    )
    out.append("")
    return out


#: Notes shown with the backlog and capacity sections instead of the HRSCH section's.
CAPACITY_NOTES = (
    "handover_costs",
    "backlog",
    "best_single_carrier",
    "capacity_share",
    "concurrency",
    "budget_sweep",
    "budget",
)


def _capacity_section(ls: dict[str, Any]) -> list[str]:
    """Best single carrier, concurrency, budget sweep and the budget check."""
    out: list[str] = []
    notes = ls.get("notes", {})
    best = ls.get("best_single_carrier")
    if best:
        out += [
            "### Backlogged download against the best single carrier",
            "",
            f"Reference per trip: the better of {', '.join(f'`{s}`' for s in best['schemes'])} "
            "(each carrier alone). Geometric mean over trips of goodput / reference [95 % CI].",
            "",
        ]
        rows = [
            [
                f"`{scheme}`",
                str(st["n_pairs"]),
                _f(st["ratio"]) + _ci(st["ci95"]),
                _f(st["ratio_of_means"]),
            ]
            for scheme, st in best["by_scheme"].items()
        ]
        out += _table(
            ["scheme", "trips", "× best single carrier [95 % CI]", "ratio of means"], rows
        )
        out.append("")
    use = ls.get("capacity_use")
    if use:
        out += [
            "### Capacity used by the backlogged download",
            "",
            "Per trip: each carrier's downlink capacity over the backlog window (Mbit/s, from the "
            "link files) and the aggregation ceiling sum / largest (what using every carrier as "
            "well as the best one alone is used would give against it).",
            "",
        ]
        rows = [
            [
                t["trip"],
                " / ".join(_f(c) for c in t["carriers_mbps"]),
                _f(t["ceiling"]),
            ]
            for t in use["trips"]
        ]
        out += _table(["trip", "carrier capacity, Mbit/s", "ceiling"], rows)
        out += [
            "",
            f"Ceiling, geometric mean over trips: {_f(use['ceiling'])}. Share of the capacity "
            "each scheme may use (its own carrier for `single-path-c<k>` over either transport "
            "and `direct-c<k>`, all otherwise), "
            "geometric mean over trips [95 % CI]:",
            "",
        ]
        rows = [
            [f"`{scheme}`", str(st["n_pairs"]), _f(st["ratio"]) + _ci(st["ci95"])]
            for scheme, st in use["by_scheme"].items()
        ]
        out += _table(["scheme", "trips", "goodput / capacity [95 % CI]"], rows)
        out.append("")
    out += _capacity_share_lines(ls.get("capacity_share"))
    conc = ls.get("concurrency")
    if conc:
        out += [
            "### Concurrent passengers",
            "",
            "N passengers, each an always-busy download: total goodput (mean over trips), "
            "its share of the carriers' capacity over the window (geometric mean [95 % CI]), "
            "Jain's index over the users' goodputs, peak RSS of relay and proxy in the window "
            "(MiB), budget peak (MiB, since start).",
            "",
        ]
        rows = []
        for n, per in conc.items():
            for scheme, c in per.items():
                rows.append(
                    [
                        n,
                        f"`{scheme}`",
                        _f(c["goodput_mbps_total"]),
                        _f(c.get("capacity_share")) + _ci(c.get("capacity_share_ci95")),
                        _f(c["jain"], 3),
                        f"{_f(c['relay_rss_mb'], 1)} / {_f(c['proxy_rss_mb'], 1)}",
                        f"{_f(c['relay_budget_peak_mb'], 1)} / {_f(c['proxy_budget_peak_mb'], 1)}",
                    ]
                )
        out += _table(
            [
                "users",
                "scheme",
                "total Mbit/s",
                "share of capacity",
                "Jain",
                "RSS relay / proxy",
                "budget peak",
            ],
            rows,
        )
        out.append("")
    sweep = ls.get("budget_sweep")
    if sweep:
        out += [
            "### Memory-budget sweep",
            "",
            "Relay and proxy `--mem-budget` per column; backlogged-download goodput (Mbit/s, "
            "mean over trips) and, in brackets, the ratio to the largest budget's.",
            "",
        ]
        budgets = list(sweep)
        schemes: list[str] = []
        for per in sweep.values():
            schemes += [s for s in per if s not in schemes]
        rows = []
        for scheme in schemes:
            row = [f"`{scheme}`"]
            for mib in budgets:
                e = sweep[mib].get(scheme)
                row.append(
                    "–"
                    if e is None
                    else f"{_f(e['backlog_goodput_mbps'])} ({_f(e['ratio_vs_largest'])})"
                )
            rows.append(row)
        out += _table(["scheme", *[f"{m} MiB" for m in budgets]], rows)
        out.append("")
    check = ls.get("budget_check")
    if check:
        verdict = (
            "no snapshot above its budget"
            if check["ok"]
            else f"**{len(check['exceeded'])} snapshot(s) above the budget**"
        )
        out += [
            f"Memory budget check: {check['n_checked']} snapshots checked, {verdict}.",
            "",
        ]
    for key in CAPACITY_NOTES[1:]:
        if key in notes:
            out += [f"*{key}: {notes[key]}.*", ""]
    return out


def _share(st: dict[str, Any] | None) -> str:
    if not st or st.get("mean") is None:
        return "–"
    return _f(st["mean"]) + _ci(st.get("ci95_trips"))


def _capacity_share_lines(share: dict[str, Any] | None) -> list[str]:
    """Each carrier's share used by each scheme's backlogged download."""
    if not share:
        return []
    n = max((len(st["carriers"] or {}) for st in share.values()), default=0)
    out = [
        "### Share of each carrier's capacity used by the backlogged download",
        "",
        "Per carrier: bytes its downlink delivered over the backlog window (the train's "
        "interface counters, headers and copies included) / what it could deliver (1500 bytes "
        "per lit opportunity); total: the carriers together; goodput: the download's goodput / "
        "all carriers' payload capacity. Mean over trips [95 % CI resampling trips].",
        "",
    ]
    rows = []
    for scheme, st in share.items():
        per = st["carriers"] or {}
        rows.append(
            [f"`{scheme}`", str(st["goodput_share"]["n_trips"])]
            + [_share(per.get(str(k))) for k in range(n)]
            + [_share(st["total"]), _share(st["goodput_share"])]
        )
    out += _table(
        ["scheme", "trips", *[f"carrier {k}" for k in range(n)], "total", "goodput"], rows
    )
    out.append("")
    return out


def _backlog_section(ls: dict[str, Any]) -> list[str]:
    """The always-busy download of the backlog phase; its note when there is none."""
    bl = ls.get("backlog")
    note = ls.get("notes", {}).get("backlog")
    if not bl:
        return [f"*backlog: {note}.*", ""] if note else []
    out = [
        "### Always-busy download (backlog phase)",
        "",
        "One download kept busy (back-to-back requests) over a window of each trip: goodput "
        "= bytes / window length, mean over trips; geometric mean of the per-trip paired "
        "ratios vs minrtt [95 % CI]; ratio of means.",
        "",
    ]
    rows = [
        [
            f"`{scheme}`",
            str(b["n_trips"]),
            _f(b["goodput_mbps_mean"]),
            _f(b["ratio_vs_minrtt"]) + _ci(b["ci95"]),
            _f(b["ratio_of_means"]),
            f"{b['completed']}/{b['requests']}",
        ]
        for scheme, b in bl.items()
    ]
    out += _table(
        [
            "scheme",
            "n trips",
            "mean Mbit/s",
            "× minrtt [95 % CI]",
            "ratio of means",
            "requests completed",
        ],
        rows,
    )
    out.append("")
    return out


def _hol_section(ls: dict[str, Any]) -> list[str]:
    """The head-of-line schedulerlets against their base pipeline; empty when none ran."""
    hol = ls.get("hol_ablation")
    if not hol:
        return []
    out = [
        "### Head-of-line schedulerlets",
        "",
        "Gain over the base pipeline (geometric mean of paired goodput ratios − 1 [95 % CI "
        "of the pairs], n pairs, and in bulk the trips' interval (n trips)) in bulk downloads "
        "(all sizes) and in the backlogged download; 'resolved' when the interval excludes 0 "
        "(the trips' interval from 10 trips on).",
        "",
    ]

    rows = [
        [f"`{s}`", f"`{e['base']}`", e["adds"], _gain_cell(e["bulk"]), _gain_cell(e["backlog"])]
        for s, e in hol.items()
    ]
    out += _table(["scheme", "base", "adds", "bulk gain", "backlog gain"], rows)
    out.append("")
    return out


def _gain_cell(g: dict[str, Any]) -> str:
    """'+5.0 % [+3.1, +6.9], n 930, trips [..] (31), resolved'; '–' without pairs."""
    if not g.get("n_pairs"):
        return "–"
    verdict = {True: "resolved", False: "not resolved", None: "n < 2"}[g.get("resolved")]
    cell = f"{_pct(g['gain'])}{_pct_ci(g['ci95'])}, n {g['n_pairs']}"
    if g.get("ci95_trips"):
        cell += f", trips{_pct_ci(g['ci95_trips'])} ({g['n_trips']})"
    return f"{cell}, {verdict}"


def _variants_section(ls: dict[str, Any]) -> list[str]:
    """Variants of hrsch and of the default pipeline against their base; empty when none ran."""
    var = ls.get("variants")
    if not var:
        return []
    out = [
        "### Variants of hrsch and of the default pipeline",
        "",
        "Gain of `scheme` over `base` (method: `variants`): bulk and backlogged downloads as "
        "for the head-of-line schedulerlets; recovery: goodput in the 2 s after each failed "
        "handover on the windows both have [95 % CI over windows]; chat: change of the mean "
        "and p90 delivery time "
        "against the base, averaged over the user counts, [95 % CI over trips] (negative = "
        "faster). For `hrsch-no-<m>` the scheme is `hrsch`: mechanism m's share inside it.",
        "",
    ]

    def chat(im: dict[str, Any] | None, k: str) -> str:
        if not im or im["change"].get(k) is None:
            return "–"
        return f"{_pct(im['change'][k])}{_pct_ci(im['ci95'].get(k))}"

    def recovery(r: dict[str, Any] | None) -> str:
        if not r:
            return "–"
        verdict = "resolved" if r["resolved"] else "not resolved"
        return f"{_pct(r['gain'])}{_pct_ci(r['ci95'])}, n {r['n_windows']}, {verdict}"

    rows = [
        [
            f"`{name}`",
            f"`{e['scheme']}` over `{e['base']}`",
            e["measures"],
            _gain_cell(e["bulk"]),
            _gain_cell(e["backlog"]),
            recovery(e.get("recovery")),
            chat(e["im"], "mean"),
            chat(e["im"], "p90"),
        ]
        for name, e in var.items()
    ]
    out += _table(
        [
            "variant",
            "gain of",
            "measures",
            "bulk",
            "backlog",
            "recovery after failed handovers",
            "chat mean",
            "chat p90",
        ],
        rows,
    )
    out.append("")
    return out


def _sched_events_section(ls: dict[str, Any]) -> list[str]:
    """What each schedulerlet did (downlink, per trip); empty when no counters."""
    ev = ls.get("scheduler_events")
    if not ev:
        return []
    keys = sorted({k for e in ev.values() for k in e["per_trip_mean"]})
    if not keys:
        return []
    out = [
        "### What the schedulerlets did",
        "",
        "Events per trip at the proxy (downlink), mean over the trips "
        "(polycorn_sched_schedulerlet_events_total).",
        "",
    ]
    rows = [
        [f"`{s}`", str(e["n_trips"])]
        + [f"{e['per_trip_mean'][k]:.1f}" if k in e["per_trip_mean"] else "–" for k in keys]
        for s, e in ev.items()
    ]
    out += _table(["scheme", "trips", *[f"`{k}`" for k in keys]], rows)
    out.append("")
    return out


def _lost_time_section(ls: dict[str, Any]) -> list[str]:
    """Where bulk downloads lose time against the oracle (all sizes pooled)."""
    lt = ls.get("lost_time")
    if not lt:
        return []
    out = [
        "### Where bulk downloads lose time",
        "",
        "All sizes pooled, summed over the downloads with a progress curve: actual and oracle "
        "time, the lost time (actual − oracle) and its shares: setup beyond the oracle's "
        "first byte, stalls while a carrier offered capacity, and the rest (rate below "
        "capacity, dark time the oracle avoided). Stalls while every carrier was dark are "
        "shown for reference (method: `lost_time`).",
        "",
    ]
    rows = []
    for scheme, per in lt.items():
        o = per.get(OVERALL)
        if not o:
            continue
        rows.append(
            [
                f"`{scheme}`",
                str(o["n"]),
                _f(o["actual_s"], 1),
                _f(o["oracle_s"], 1),
                _f(o["lost_s"], 1),
                _pct(o["setup_excess_share"], 0, sign=False),
                _pct(o["stall_lit_share"], 0, sign=False),
                _pct(o["slow_share"], 0, sign=False),
                _f(o["stall_dark_s"], 1),
            ]
        )
    out += _table(
        [
            "scheme",
            "n",
            "actual s",
            "oracle s",
            "lost s",
            "setup",
            "stalled, lit",
            "slow",
            "stalled dark s",
        ],
        rows,
    )
    out.append("")
    return out


def _stall_section(ls: dict[str, Any]) -> list[str]:
    """What bulk downloads' stalls waited for, from the segment traces (SEGMENT_TRACE=1)."""
    sc = ls.get("stall_causes")
    if not sc:
        return []
    out = [
        "### Where stalls come from",
        "",
        "Bulk downloads of the traced schemes: every stall (≥ 300 ms without a new byte) "
        "traced to the segment the passenger waited for. Stranded: its first copy's path did "
        "not deliver it and a copy sent again ended the stall, split into the wait until it "
        "was sent again and that copy's trip (seconds, by the cause of the resend); slow: "
        "the first copy arrived late on its own path; not sent: the proxy wrote it only "
        "after the stall began (method: `stall_causes`).",
        "",
    ]
    rows = []
    for scheme, x in sc["schemes"].items():
        sh, st = x["by_kind_share"], x["stranded"]
        causes = ", ".join(f"{c} {_f(v / 1000, 1)}" for c, v in sorted(st["by_cause_ms"].items()))
        rows.append(
            [
                f"`{scheme}`",
                str(x["downloads"]),
                str(x["stalls"]),
                _f(x["stall_ms"] / 1000, 1),
                _pct(sh["stranded"], 0, sign=False),
                _pct(sh["slow"], 0, sign=False),
                _pct(sh["not_sent"], 0, sign=False),
                _pct(sh["unmatched"], 0, sign=False),
                _f(st["wait_resend_ms"] / 1000, 1),
                _f(st["resend_transit_ms"] / 1000, 1),
                causes or "–",
                str(x.get("dropped_records", 0)),
            ]
        )
    out += _table(
        [
            "scheme",
            "downloads",
            "stalls",
            "stalled s",
            "stranded",
            "slow",
            "not sent",
            "unmatched",
            "wait to resend s",
            "resend trip s",
            "resend causes (s)",
            "trace records dropped",
        ],
        rows,
    )
    out += [
        "",
        "Each carrier's use during the same downloads (request to last byte): the bytes it "
        "delivered (every copy) over its downlink capacity, and how the proxy's samples of the "
        "path (every 100 ms) found it: room in its window (available: the connection's "
        "window or the origin held data back), window or queue full, stale, in timeout.",
        "",
    ]
    rows = []
    for scheme, x in sc["schemes"].items():
        for path, u in (x.get("path_use") or {}).items():
            st = u["state_share"]
            rows.append(
                [
                    f"`{scheme}`",
                    str(path),
                    _f(u["capacity_bytes"] / 1e6, 1),
                    _f(u["delivered_bytes"] / 1e6, 1),
                    _pct(u["used_share"], 0, sign=False),
                    *(
                        _pct(st[k], 0, sign=False)
                        for k in ("available", "full", "stale", "timeout")
                    ),
                ]
            )
    setup_rows = []
    for scheme, x in sc["schemes"].items():
        su = x.get("setup") or {}
        if not su.get("n"):
            continue
        setup_rows.append(
            [
                f"`{scheme}`",
                str(su["n"]),
                *(
                    f"{_f(su[f'{k}_median_ms'], 0)} / {_f(su[f'{k}_p90_ms'], 0)}"
                    for k in ("request", "server", "response")
                ),
                str(su["request_rerouted"]),
                _pct(su.get("window_limited_share"), 0, sign=False),
            ]
        )
    out += _table(
        [
            "scheme",
            "carrier",
            "capacity MB",
            "delivered MB",
            "used",
            "available",
            "full",
            "stale",
            "timeout",
        ],
        rows,
    )
    win_rows = []
    for scheme, x in sc["schemes"].items():
        w = x.get("window_frames") or {}
        if not w.get("n"):
            continue
        per_path = "; ".join(
            f"path {p}: {_f(v['median_ms'], 0)} / {_f(v['p90_ms'], 0)} (n {v['n']})"
            for p, v in (w.get("by_path") or {}).items()
        )
        win_rows.append(
            [
                f"`{scheme}`",
                str(w["n"]),
                f"{_f(w['median_ms'], 0)} / {_f(w['p90_ms'], 0)}",
                per_path,
            ]
        )
    if setup_rows:
        out += [
            "",
            "Set-up of the same downloads (ms, median / p90): the request's first byte from "
            "the relay to the proxy, the proxy's upstream connect and the origin's answer, "
            "the response's first segment back; how many requests arrived on another "
            "path than the one they were first sent on; and the share of the downloads' time "
            "their new data waited only for the relay's flow-control window.",
            "",
        ]
        out += _table(
            [
                "scheme",
                "downloads",
                "request",
                "server",
                "response",
                "request rerouted",
                "window-limited share of download time",
            ],
            setup_rows,
        )
    if win_rows:
        out += [
            "",
            "The relay's WINDOW frames (new flow-control credit) from the relay to the proxy "
            "(ms, median / p90), by the path they went out on.",
            "",
        ]
        out += _table(["scheme", "frames", "all", "by path"], win_rows)
    out.append("")
    return out


def _run_to_run_section(rr: dict[str, Any] | None) -> list[str]:
    """The overall hrsch/minrtt ratio of several runs of one configuration
    (``python -m polycorn_bench.runs``); empty without it."""
    if not rr:
        return []
    out = [
        "## Run-to-run variation",
        "",
        f"The overall hrsch/minrtt ratio (geometric mean of the paired bulk ratios) in "
        f"{rr['runs']} runs of the same configuration"
        + ("" if rr.get("same_trips", True) else " (**not all on the same trips**)")
        + ", each with its own 95 % bootstrap interval (downloads resampled within the run).",
        "",
    ]
    rows = [
        [
            str(i + 1),
            f"`{src}`",
            f"`{commit}`" if commit else "–",
            str(n),
            _f(r, 3) + f" [{ci[0]:.3f}, {ci[1]:.3f}]",
        ]
        for i, (src, commit, n, r, ci) in enumerate(
            zip(
                rr["sources"],
                rr["commits"],
                rr["n_pairs"],
                rr["hrsch_vs_minrtt"],
                rr["ci95"],
                strict=True,
            )
        )
    ]
    out += _table(["run", "source", "commit", "pairs", "hrsch / minrtt [95 % CI]"], rows)
    lo, hi = rr["combined_ci95"]
    out += [
        "",
        f"Geometric mean over the runs {_f(rr['mean'], 3)}; SD between runs "
        f"{_f(rr['sd_between_runs'], 3)} (of the log ratios, about a relative SD); "
        f"between-run SD beyond the within-run error (DerSimonian-Laird τ) "
        f"{_f(rr['tau'], 3)}. Combined, with the between-run variance: "
        f"**{_f(rr['combined'], 3)} [{lo:.3f}, {hi:.3f}]** (half-width "
        f"{_f(rr['combined_ci95_halfwidth'], 3)}); one run's interval with it would have a "
        f"half-width of about {_f(rr['single_run_ci95_halfwidth'], 3)}.",
        "",
    ]
    trips_ci = rr.get("single_run_trips_ci95")
    if trips_ci:
        out += [
            "With the intervals that resample trips instead (the between-trip variation in "
            "them) and the same τ added, one run's interval is "
            f"[{trips_ci[0]:.3f}, {trips_ci[1]:.3f}] around the combined ratio, a half-width "
            f"of **{_f(rr.get('single_run_trips_ci95_halfwidth'), 3)}**: trips, downloads "
            "and run-to-run variation together.",
            "",
        ]
    return out


def _verdict_ci(entry: dict[str, Any]) -> Any:
    """The interval a verdict of ``hrsch_vs_baselines`` reads (its ``verdict_interval``)."""
    return entry.get(entry.get("verdict_interval") or "ci95") or entry.get("ci95")


def _bin_title(b: str) -> str:
    return "1 handover" if b == "1" else f"{b} handovers"


def markdown(doc: dict[str, Any]) -> str:
    out = [
        "# HSR benchmark",
        "",
        f"Profile `{doc.get('profile')}`, generated {doc.get('generated')}.",
        provenance.describe(doc),
        "",
    ]
    for name, ls in doc.get("link_sets", {}).items():
        out += [f"## Link set `{name}`", ""]
        if ls.get("description"):
            out += [ls["description"], ""]
        out += [f"Trips: {', '.join(ls.get('trips', [])) or 'none'}.", ""]
        out += _bulk_section(doc, ls)
        out += _bulk_by_handovers_section(ls)
        out += _backlog_section(ls)
        out += _capacity_section(ls)
        out += _costs_section(ls)
        out += _hol_section(ls)
        out += _variants_section(ls)
        out += _sched_events_section(ls)
        out += _lost_time_section(ls)
        out += _stall_section(ls)
        out += _im_section(ls)
        out += _hrsch_section(doc, ls)
    out += _run_to_run_section(doc.get("run_to_run"))
    out += ["## Method", ""]
    out += [f"- **{k}**: {v}" for k, v in METHODS.items()]
    issues = doc.get("issues", {})
    if issues.get("total"):
        out += ["", "## Input problems (skipped)", ""]
        out += [f"- {k}: {v}" for k, v in issues.get("by_kind", {}).items()]
        out += [f"  - e.g. {e}" for e in issues.get("examples", [])[:10]]
    out.append("")
    return "\n".join(out)


def _bulk_section(doc: dict[str, Any], ls: dict[str, Any]) -> list[str]:
    bulk = ls.get("bulk", {})
    if not bulk:
        return []
    out = [
        "### Bulk downloads",
        "",
        "Per size: n downloads with a goodput (timeouts included as censored values), "
        "median goodput, geometric mean of paired goodput ratios vs minrtt with 95 % "
        "bootstrap CI, ratio of means, geometric mean of oracle time / actual time, "
        "timeouts and other failures.",
        "",
    ]
    for label in _ordered_labels(doc, bulk):
        out += [f"**{label}**", ""]
        rows = []
        for scheme, per in bulk.items():
            s = per.get(label)
            if s is None:
                continue
            rows.append(
                [
                    f"`{scheme}`",
                    str(s["n"]),
                    _f(s["goodput_mbps_median"]),
                    _f(s["ratio_vs_minrtt"]) + _ci(s["ci95"]),
                    _f(s["ratio_of_means"]),
                    _f(s["ratio_vs_oracle"]),
                    str(s["n_timeout"]),
                    str(s["n_failed"]),
                ]
            )
        out += _table(
            [
                "scheme",
                "n",
                "median Mbit/s",
                "× minrtt [95 % CI]",
                "ratio of means",
                "× oracle",
                "timeouts",
                "failed",
            ],
            rows,
        )
        out.append("")
    return out


def _bulk_by_handovers_section(ls: dict[str, Any]) -> list[str]:
    by_ho = ls.get("bulk_by_handovers")
    if not by_ho:
        return []
    out = [
        "### Bulk downloads by handovers during the flow",
        "",
        "All sizes pooled. A pair's bin is the number of `handover_start` events (any "
        "carrier) during the minrtt download of the pair; cells: n, geometric mean "
        "ratio vs minrtt [95 % CI].",
        "",
    ]
    rows = []
    for scheme, per in by_ho.items():
        row = [f"`{scheme}`"]
        for b in HANDOVER_BINS:
            s = per.get(b, {})
            row.append(f"{s.get('n', 0)}: {_f(s.get('ratio_vs_minrtt'))}{_ci(s.get('ci95'))}")
        rows.append(row)
    out += _table(["scheme", *[_bin_title(b) for b in HANDOVER_BINS]], rows)
    out.append("")
    return out


def _im_section(ls: dict[str, Any]) -> list[str]:
    im = ls.get("im", {})
    if not im:
        return []
    out = [
        "### Interactive messages",
        "",
        "Delay of delivered messages: mean, p90, coefficient of variation of per-user "
        "means; in brackets the ratio vs single-path / vs minrtt.",
        "",
    ]
    rows = []
    for scheme, per in im.items():
        for u, s in per.items():
            sp, mr = s.get("vs_single_path", {}), s.get("vs_minrtt", {})
            rows.append(
                [
                    f"`{scheme}`",
                    u,
                    f"{s['n_ok']}/{s['n_ok'] + s['n_failed']}",
                    f"{_f(s['mean_ms'], 1)} ({_f(sp.get('mean'))} / {_f(mr.get('mean'))})",
                    f"{_f(s['p90_ms'], 1)} ({_f(sp.get('p90'))} / {_f(mr.get('p90'))})",
                    f"{_f(s['cov'])} ({_f(sp.get('cov'))} / {_f(mr.get('cov'))})",
                ]
            )
    out += _table(["scheme", "users", "delivered", "mean ms", "p90 ms", "cov"], rows)
    out.append("")
    return out


def text_table(doc: dict[str, Any]) -> str:
    """A compact table for a terminal: primary link set, ratio vs minrtt per size."""
    name = doc.get("link_set")
    bulk = doc.get("bulk", {})
    lines = [f"HSR benchmark ({doc.get('profile')}), link set {name}: goodput ratio vs minrtt"]
    if not bulk:
        return "\n".join([*lines, "  (no bulk downloads)", *_capacity_lines(doc)])
    labels = _ordered_labels(doc, bulk)
    header = ["scheme", *labels, "median Mbit/s", "× oracle"]
    rows = []
    for scheme, per in bulk.items():
        overall = per.get(OVERALL, {})
        rows.append(
            [
                scheme,
                *[_f(per.get(lbl, {}).get("ratio_vs_minrtt")) for lbl in labels],
                _f(overall.get("goodput_mbps_median")),
                _f(overall.get("ratio_vs_oracle")),
            ]
        )
    users = [str(u) for u in doc.get("users", [])]
    im = doc.get("im", {})
    if im and users:
        u = users[-1]
        header.append(f"IM p90 ms ({u} users)")
        for row in rows:
            row.append(_f(im.get(row[0], {}).get(u, {}).get("p90_ms"), 0))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    lines += [fmt(header), *[fmt(r) for r in rows]]
    vs = (doc.get("hrsch_vs_baselines") or {}).get("minrtt", {}).get(OVERALL)
    if vs:
        words = _plain_vs_paper(_verdict_ci(vs), vs.get("paper"), vs["n_pairs"])
        trips = (
            f", trips{_ci(vs['ci95_trips'])} (half-width {_f(vs.get('ci95_trips_halfwidth'), 3)}"
            f", {vs.get('n_trips')} trips)"
            if vs.get("ci95_trips")
            else ""
        )
        lines.append(
            f"hrsch/minrtt overall {_f(vs['ratio'])}{_ci(vs['ci95'])}{trips} (paper "
            f"{_f(vs.get('paper'))}: {words}), n {vs['n_pairs']}"
        )
    hof = doc.get("hof_recovery")
    if hof and hof.get("hrsch_vs_minrtt_mean") is not None:
        paper = PAPER["hof_recovery"]
        mean_ci = hof.get("hrsch_vs_minrtt_mean_ci95")
        median_ci = hof.get("hrsch_vs_minrtt_median_ci95")
        lines.append(
            f"after failed handovers: hrsch/minrtt mean {_f(hof['hrsch_vs_minrtt_mean'])}"
            f"{_ci(mean_ci)} (paper {paper['hrsch_vs_minrtt_mean']:.1f}: "
            f"{_plain_vs_paper(mean_ci, paper['hrsch_vs_minrtt_mean'], hof['n'])}), median "
            f"{_f(hof['hrsch_vs_minrtt_median'])}{_ci(median_ci)} (paper "
            f"{paper['hrsch_vs_minrtt_median']:.1f}: "
            f"{_plain_vs_paper(median_ci, paper['hrsch_vs_minrtt_median'], hof['n'])}), "
            f"n {hof['n']} ({hof.get('n_bulk', 0)} bulk, {hof.get('n_backlog', 0)} backlog)"
        )
    bl = (doc.get("backlog") or {}).get("hrsch")
    if bl and bl.get("ratio_vs_minrtt") is not None:
        lines.append(
            f"backlog (always busy): hrsch/minrtt {_f(bl['ratio_vs_minrtt'])}{_ci(bl['ci95'])}, "
            f"n {bl['n_pairs']}"
        )
    lines += _capacity_lines(doc)
    total = doc.get("issues", {}).get("total", 0)
    if total:
        lines.append(f"({total} input problems skipped: see the report)")
    return "\n".join(lines)


def _capacity_lines(doc: dict[str, Any]) -> list[str]:
    """The best-single-carrier ratios of minrtt and hrsch and a failed budget check."""
    lines = []
    best = doc.get("best_single_carrier")
    if best:
        parts = [
            f"{s} {_f(st['ratio'])}{_ci(st['ci95'])}"
            for s, st in best["by_scheme"].items()
            if s in ("minrtt", "hrsch")
        ]
        if parts:
            lines.append("backlog / best single carrier: " + ", ".join(parts))
    check = doc.get("budget_check")
    if check and not check["ok"]:
        lines.append(f"memory budget: {doc.get('notes', {}).get('budget', 'violated')}")
    return lines
