"""Markdown report and compact plain-text table from an ``hsr.json`` document."""

from __future__ import annotations

from typing import Any

from polycorn_bench.analysis import HANDOVER_BINS, METHODS, OVERALL


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


def _bin_title(b: str) -> str:
    return "1 handover" if b == "1" else f"{b} handovers"


def markdown(doc: dict[str, Any]) -> str:
    out = [
        "# HSR benchmark",
        "",
        f"Profile `{doc.get('profile')}`, commit `{doc.get('commit')}`, "
        f"generated {doc.get('generated')}.",
        "",
    ]
    for name, ls in doc.get("link_sets", {}).items():
        out += [f"## Link set `{name}`", ""]
        if ls.get("description"):
            out += [ls["description"], ""]
        out += [f"Trips: {', '.join(ls.get('trips', [])) or 'none'}.", ""]
        bulk = ls.get("bulk", {})
        if bulk:
            out += ["### Bulk downloads", ""]
            out += [
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
        by_ho = ls.get("bulk_by_handovers")
        if by_ho:
            out += [
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
                    row.append(
                        f"{s.get('n', 0)}: {_f(s.get('ratio_vs_minrtt'))}{_ci(s.get('ci95'))}"
                    )
                rows.append(row)
            out += _table(["scheme", *[_bin_title(b) for b in HANDOVER_BINS]], rows)
            out.append("")
        im = ls.get("im", {})
        if im:
            out += [
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
    out += ["## Method", ""]
    out += [f"- **{k}**: {v}" for k, v in METHODS.items()]
    issues = doc.get("issues", {})
    if issues.get("total"):
        out += ["", "## Input problems (skipped)", ""]
        out += [f"- {k}: {v}" for k, v in issues.get("by_kind", {}).items()]
        out += [f"  - e.g. {e}" for e in issues.get("examples", [])[:10]]
    out.append("")
    return "\n".join(out)


def text_table(doc: dict[str, Any]) -> str:
    """A compact table for a terminal: primary link set, ratio vs minrtt per size."""
    name = doc.get("link_set")
    bulk = doc.get("bulk", {})
    lines = [f"HSR benchmark ({doc.get('profile')}), link set {name}: goodput ratio vs minrtt"]
    if not bulk:
        return "\n".join([*lines, "  (no bulk downloads)"])
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
    total = doc.get("issues", {}).get("total", 0)
    if total:
        lines.append(f"({total} input problems skipped: see the report)")
    return "\n".join(lines)
