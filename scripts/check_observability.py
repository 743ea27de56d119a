"""Check the alert rules and dashboards against what the services really export.

    check_observability.py metrics --rules R.yml... --dashboards D.json... --exposition SOURCE...
    check_observability.py metrics --rules R.yml... --dashboards D.json... --prometheus URL
    check_observability.py query --prometheus URL [--var NAME=VALUE]... [--allow-empty RE]... D...
    check_observability.py promql-rules D.json... > dashboards.rules.yml
    check_observability.py alerts --rules R.yml... --tests T.yml... --scrape-config P.yml
    check_observability.py dashboards --provisioning DIR D.json...
    check_observability.py sql --database-url URL [--expect-rows TITLE]... D.json...
    check_observability.py families --committed DIR [--refresh CMD] LIVE.prom...

``metrics``: every PromQL expression of the recording and alerting rules and
of the dashboards (panel targets and Prometheus template variables) is parsed
with a real PromQL parser (``promql-parser``, the Rust crate's bindings), and
every metric name it selects must be a series that one of the SOURCEs
exports, a recording rule of the rule files, or one Prometheus makes itself
(``up``, ``ALERTS``, ...). A SOURCE is a ``/metrics`` dump (file) or a URL to
scrape; the exported names come from the ``# TYPE``/``# HELP`` lines (a
family exists even before it has samples) and the sample lines, with the
suffixes of each type (``_total`` of counters, ``_bucket``/``_sum``/
``_count`` of histograms). Label names in matchers must be ones the metric's
samples carry, or a target label (``job``, ``instance``, ``train``).
``--prometheus URL`` takes the same from a Prometheus that scrapes the
services (its metadata API for the families, its series for the samples
and their labels), e.g. the compose testbed's.

``query``: evaluates every dashboard PromQL expression on a Prometheus that
scrapes the services and has the rules loaded (Grafana's variables set with
``--var``, range variables 1m): Prometheus must answer each without an
error and with at least one series, unless the expression matches an
``--allow-empty`` regular expression.

``promql-rules``: writes every dashboard PromQL expression (Grafana's
variables replaced as above) as a recording rule, so that ``promtool check
rules`` parses the dashboards with Prometheus's own parser too.

``alerts``: every alert has a ``severity`` label, ``summary`` and
``description`` annotations and a ``runbook_url`` to its anchor in
docs/operations.md (``#`` + the alert's name in lower case), and a promtool
unit test where it fires and one where it must not; every ``job`` the rules
match is a job of the scrape configuration.

``dashboards``: structure tsc cannot see: unique uids and panel ids, the
schema version, panels inside the 24-column grid and not overlapping, and
every datasource (panels, targets, variables) one that Grafana's provisioning
defines, with the same plugin type.

``sql``: every LinkDB query of the dashboards (panels and variables) runs
against a real LinkDB, read-only, with Grafana's macros expanded
(``$__timeFilter``, ``$__timeGroupAlias``, ``$__timeGroup``) and each SQL
variable replaced by its query's values. ``--expect-rows`` names panels that
must return at least one row.

``families``: the metric families (name and type, from the ``# TYPE``
lines) of each LIVE dump (scraped from a running service) are those of the
dump of the same file name in DIR, the committed fixtures that the offline
check (make validate-platform) tests the rules and dashboards
against; with ``--refresh CMD``, a difference names CMD as the way to
refresh them. Every committed dump must have a live one and vice versa.

Exit status: 0 when everything checks, 1 on any finding, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import psycopg
import yaml

from polycorn_schema.startup import http_ready, pg_connect

# Series Prometheus makes itself (per target, and for alerts).
BUILTIN = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "ALERTS",
    "ALERTS_FOR_STATE",
}
# Labels that Prometheus (job, instance) or the scrape configuration (train:
# services/prometheus/prometheus.compose.yml, the chart's ServiceMonitors)
# attach to every series of a target, and the le/quantile of histograms.
TARGET_LABELS = {"job", "instance", "train", "__name__", "le", "quantile"}
# Grafana's built-in datasources, which need no provisioning.
GRAFANA_BUILTIN_DS = {"-- Grafana --", "-- Mixed --", "-- Dashboard --", "grafana"}
RANGE_VARS = re.compile(r"\$\{?__(?:rate_interval|interval|range)(?:_ms|_s)?\}?")
TEMPLATE_VARS = re.compile(
    r"\$\{[A-Za-z0-9_]+(?::[^}]*)?\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[A-Za-z0-9_]+\]\]"
)
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gauge": ("",),
    "unknown": ("",),
    "untyped": ("",),
}


class CheckError(Exception):
    """A check failed; the message says where and why."""


# ------------------------------------------------------------------ expressions


@dataclass(frozen=True)
class Expr:
    """A PromQL expression and where it comes from (for messages)."""

    where: str
    text: str


def grafana_to_promql(text: str) -> str:
    """Replace Grafana's variables so that the expression parses: range
    variables by a duration, template variables by a plain word."""
    text = RANGE_VARS.sub("5m", text)
    return TEMPLATE_VARS.sub("grafana_variable", text)


def rule_exprs(paths: Iterable[Path]) -> tuple[list[Expr], set[str]]:
    exprs: list[Expr] = []
    recorded: set[str] = set()
    for path in paths:
        doc = yaml.safe_load(path.read_text())
        for g in doc.get("groups", []):
            for r in g.get("rules", []):
                name = r.get("record") or r.get("alert")
                if "record" in r:
                    recorded.add(r["record"])
                exprs.append(Expr(f"{path.name}: {g['name']}/{name}", str(r["expr"])))
    return exprs, recorded


def panels_of(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d.get("panels", []):
        yield p
        yield from p.get("panels", [])


def is_prometheus(ds: Any, default: Any) -> bool:
    ds = ds if ds is not None else default
    return isinstance(ds, dict) and (
        ds.get("type") == "prometheus" or ds.get("uid") == "prometheus"
    )


def label_values_expr(query: str) -> str | None:
    """The PromQL inside a Prometheus template variable's query, if any."""
    q = query.strip()
    m = re.fullmatch(r"label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", q, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    if m:
        return m.group(1)
    return None


def dashboard_exprs(paths: Iterable[Path]) -> list[Expr]:
    exprs: list[Expr] = []
    for path in paths:
        d = json.loads(path.read_text())
        for p in panels_of(d):
            for t in p.get("targets", []):
                if "expr" in t and is_prometheus(t.get("datasource"), p.get("datasource")):
                    exprs.append(
                        Expr(f"{path.name}: panel {p.get('title')!r} {t.get('refId')}", t["expr"])
                    )
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") != "query" or not is_prometheus(v.get("datasource"), None):
                continue
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else str(q or "")
            inner = label_values_expr(q)
            if inner is not None:
                exprs.append(Expr(f"{path.name}: variable {v.get('name')}", inner))
    return exprs


@dataclass
class Selector:
    name: str
    labels: list[str]


def selectors(text: str) -> list[Selector]:
    """Every vector selector of the expression (inside range vectors,
    subqueries and function calls too)."""
    tree = promql_parser.parse(grafana_to_promql(text))
    found: list[Selector] = []

    def visit(e: promql_parser.Expr) -> bool | None:
        if isinstance(e, promql_parser.VectorSelector):
            labels = [m.name for m in e.matchers.matchers]
            name = e.name
            if name is None:
                eq = [
                    m
                    for m in e.matchers.matchers
                    if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
                ]
                name = eq[0].value if eq else None
            if name is None:
                raise CheckError(f"selects by a regular expression on __name__: {text!r}")
            found.append(Selector(name, [x for x in labels if x != "__name__"]))
        return None

    promql_parser.walk(tree, visit)
    return found


# ------------------------------------------------------------------ exposition


@dataclass
class Exported:
    """Series names and their label names, from every SOURCE."""

    names: dict[str, set[str]] = field(default_factory=dict)  # name -> label names seen
    families: int = 0
    sources: list[str] = field(default_factory=list)

    def add(self, name: str, labels: Iterable[str] = ()) -> None:
        self.names.setdefault(name, set()).update(labels)


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')


def family_names(name: str, kind: str) -> list[str]:
    kind = kind.lower()
    base = name
    if kind == "counter" and base.endswith("_total"):
        base = base[: -len("_total")]
    return [base + s for s in SUFFIXES.get(kind, ("",))]


def read_source(src: str) -> str:
    if src.startswith(("http://", "https://")):
        req = urllib.request.Request(src, headers={"Accept": "text/plain"})  # noqa: S310 (scheme checked)
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
            return str(r.read().decode())
    return Path(src).read_text()


def get_json(url: str) -> Any:
    if not url.startswith(("http://", "https://")):
        raise CheckError(f"not an http(s) URL: {url}")
    # A Prometheus that is still starting answers 503 (or nothing): waited for, bounded.
    body = json.loads(http_ready(url, what=f"Prometheus API {url}", timeout_s=60))
    if body.get("status") != "success":
        raise CheckError(f"{url}: {body.get('error')}")
    return body["data"]


def read_prometheus(base: str, into: Exported) -> None:
    """Families from the metadata API (HELP/TYPE of every scraped target,
    with or without samples), sample names and labels from the series of the
    last 10 minutes."""
    base = base.rstrip("/")
    meta = get_json(f"{base}/api/v1/metadata")
    for name, entries in meta.items():
        for n in family_names(name, entries[0].get("type", "unknown")):
            into.add(n)
    q = urllib.parse.urlencode({"match[]": '{__name__=~".+"}', "start": f"{time.time() - 600:.0f}"})
    series = get_json(f"{base}/api/v1/series?{q}")
    for s in series:
        into.add(s["__name__"], [k for k in s if k != "__name__"])
    if not meta:
        raise CheckError(f"{base}: Prometheus has no metric metadata (no target scraped yet?)")
    into.families += len(meta)
    into.sources.append(f"{base} ({len(meta)} families, {len(series)} series)")


def parse_exposition(text: str, into: Exported, src: str) -> int:
    families = 0
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                families += 1
                for n in family_names(parts[2], parts[3]):
                    into.add(n)
        elif line.startswith("#") or not line.strip():
            continue
        else:
            m = SAMPLE.match(line)
            if not m:
                raise CheckError(f"{src}: not an exposition line: {line[:80]!r}")
            into.add(m.group(1), LABEL.findall(m.group(3) or ""))
    if families == 0:
        raise CheckError(f"{src}: no metric family (# TYPE line): not a /metrics dump")
    into.families += families
    into.sources.append(f"{src} ({families} families)")
    return families


# ------------------------------------------------------------------ metrics check


def check_metrics(exprs: list[Expr], recorded: set[str], exported: Exported) -> list[str]:
    problems: list[str] = []
    used: set[str] = set()
    for e in exprs:
        try:
            sels = selectors(e.text)
        except (ValueError, CheckError) as err:
            problems.append(f"{e.where}: does not parse as PromQL: {err}")
            continue
        if not sels:
            problems.append(f"{e.where}: selects no metric at all: {e.text!r}")
        for sel in sels:
            used.add(sel.name)
            if sel.name in recorded or sel.name in BUILTIN:
                continue
            if ":" in sel.name:
                problems.append(f"{e.where}: no recording rule named {sel.name}")
                continue
            if sel.name not in exported.names:
                problems.append(f"{e.where}: no service exports {sel.name}")
                continue
            have = exported.names[sel.name]
            # A family without samples tells no labels; only check seen ones.
            for label in sel.labels:
                if have and label not in have and label not in TARGET_LABELS:
                    problems.append(
                        f"{e.where}: {sel.name} has no label {label!r} "
                        f"(it has {', '.join(sorted(have))})"
                    )
    print(
        f"metrics: {len(exprs)} PromQL expressions select {len(used)} names "
        f"({len(used & recorded)} recording rules, {len(used & BUILTIN)} Prometheus built-ins, "
        f"{len(used - recorded - BUILTIN)} service metrics); "
        f"{exported.families} families exported by {len(exported.sources)} sources"
    )
    for s in exported.sources:
        print(f"  source {s}")
    return problems


# ------------------------------------------------------------------ query check


def check_query(
    paths: list[Path], base: str, variables: dict[str, str], allow_empty: list[str]
) -> list[str]:
    problems: list[str] = []
    empty_ok = [re.compile(r) for r in allow_empty]
    exprs = dashboard_exprs(paths)
    answered = 0

    def var(m: re.Match[str]) -> str:
        name = m.group(0).strip("${}[]").split(":")[0]
        if name not in variables:
            raise CheckError(f"no --var for {m.group(0)}")
        return variables[name]

    for e in exprs:
        try:
            q = TEMPLATE_VARS.sub(var, RANGE_VARS.sub("1m", e.text))
            url = f"{base.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': q})}"
            result = get_json(url)["result"]
        except (CheckError, OSError) as err:
            problems.append(f"{e.where}: {err}")
            continue
        answered += 1
        if not result and not any(r.search(e.text) for r in empty_ok):
            problems.append(f"{e.where}: no series: {q}")
    print(f"query: {answered} of {len(exprs)} dashboard expressions answered by {base}")
    return problems


# ------------------------------------------------------------------ dashboards as rules


def promql_rules(paths: list[Path]) -> str:
    rules = [
        {"record": f"dashboard:expr:{n}", "expr": grafana_to_promql(e.text)}
        for n, e in enumerate(dashboard_exprs(paths))
    ]
    if not rules:
        raise CheckError("the dashboards have no PromQL expression")
    doc = {"groups": [{"name": "dashboards", "rules": rules}]}
    return "# Generated by scripts/check_observability.py promql-rules\n" + yaml.safe_dump(doc)


# ------------------------------------------------------------------ alerts check

SEVERITIES = {"critical", "warning", "info"}
JOB_MATCHER = re.compile(r'job=~?"([^"]+)"')


def check_alerts(rules: list[Path], tests: list[Path], scrape_config: Path) -> list[str]:
    alerts = read_alerts(rules)
    firing, quiet = tested_alerts(tests)
    jobs = {
        c["job_name"] for c in yaml.safe_load(scrape_config.read_text()).get("scrape_configs", [])
    }
    problems: list[str] = []
    for name, r in sorted(alerts.items()):
        problems += annotation_problems(name, r)
        if name not in firing:
            problems.append(f"{name}: no promtool test where it fires")
        if name not in quiet:
            problems.append(f"{name}: no promtool test where it must stay quiet")
        problems += [
            f"{name}: job {job!r} is not scraped by {scrape_config.name}"
            for m in JOB_MATCHER.findall(str(r["expr"]))
            for job in m.split("|")
            if job not in jobs
        ]
    for name in sorted((firing | quiet) - set(alerts)):
        problems.append(f"tests name an alert the rules do not have: {name}")
    print(
        f"alerts: {len(alerts)} alerts, {len(firing & set(alerts))} with a firing test, "
        f"{len(quiet & set(alerts))} with a quiet test; jobs scraped: {sorted(jobs)}"
    )
    return problems


def read_alerts(rules: list[Path]) -> dict[str, dict[str, Any]]:
    """Alert name -> its rule, from Prometheus rule files."""
    alerts: dict[str, dict[str, Any]] = {}
    for path in rules:
        for g in yaml.safe_load(path.read_text()).get("groups", []):
            for r in g.get("rules", []):
                if "alert" in r:
                    alerts[r["alert"]] = r
    return alerts


def tested_alerts(tests: list[Path]) -> tuple[set[str], set[str]]:
    """The alerts promtool unit tests expect to fire, and those they expect quiet."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in tests:
        for t in yaml.safe_load(path.read_text()).get("tests", []):
            for case in t.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    return firing, quiet


def annotation_problems(name: str, r: dict[str, Any]) -> list[str]:
    """An alert rule's severity label, summary and description, and runbook anchor."""
    problems: list[str] = []
    labels, ann = r.get("labels", {}), r.get("annotations", {})
    if labels.get("severity") not in SEVERITIES:
        problems.append(f"{name}: severity {labels.get('severity')!r} not in {sorted(SEVERITIES)}")
    for key in ("summary", "description"):
        if not ann.get(key):
            problems.append(f"{name}: no {key} annotation")
    want = f"docs/operations.md#{name.lower()}"
    if ann.get("runbook_url") != want:
        problems.append(f"{name}: runbook_url {ann.get('runbook_url')!r} is not {want!r}")
    return problems


# ------------------------------------------------------------------ dashboards check


def provisioned(dir_: Path) -> dict[str, str]:
    """uid -> plugin type of every provisioned datasource."""
    out: dict[str, str] = {}
    for f in sorted((dir_ / "datasources").glob("*.y*ml")):
        for ds in yaml.safe_load(f.read_text()).get("datasources", []):
            out[ds["uid"]] = ds["type"]
    if not out:
        raise CheckError(f"{dir_}/datasources: no datasource provisioned")
    return out


def check_dashboards(
    paths: list[Path], datasources: dict[str, str], schema_version: int
) -> list[str]:
    problems: list[str] = []
    uids: dict[str, str] = {}
    for path in paths:
        d = json.loads(path.read_text())
        uid = d.get("uid")
        if not isinstance(uid, str) or not 1 <= len(uid) <= 40:
            problems.append(f"{path.name}: uid {uid!r} must be a string of 1-40 characters")
        elif uid in uids:
            problems.append(f"{path.name}: uid {uid!r} already used by {uids[uid]}")
        else:
            uids[uid] = path.name
        if not d.get("title"):
            problems.append(f"{path.name}: no title")
        if d.get("schemaVersion") != schema_version:
            problems.append(
                f"{path.name}: schemaVersion {d.get('schemaVersion')} is not {schema_version}"
            )
        problems += panel_problems(path.name, d, datasources)
        for v in d.get("templating", {}).get("list", []):
            problems += datasource_problems(
                f"{path.name}: variable {v.get('name')}", v.get("datasource"), datasources
            )
    print(f"dashboards: {len(paths)} dashboards, datasources provisioned: {datasources}")
    return problems


def panel_problems(name: str, d: dict[str, Any], datasources: dict[str, str]) -> list[str]:
    """A dashboard's panels: unique ids, their targets' datasources and refIds, and a
    place on the 24-column grid that no other panel takes."""
    problems: list[str] = []
    ids: set[Any] = set()
    boxes: list[tuple[str, int, int, int, int]] = []
    for p in panels_of(d):
        where = f"{name}: panel {p.get('id')} {p.get('title')!r}"
        if p.get("id") in ids:
            problems.append(f"{where}: duplicate panel id")
        ids.add(p.get("id"))
        problems += datasource_problems(where, p.get("datasource"), datasources)
        for t in p.get("targets", []):
            problems += datasource_problems(
                f"{where} target {t.get('refId')}", t.get("datasource"), datasources
            )
            if not t.get("refId"):
                problems.append(f"{where}: a target without refId")
        refs = [t.get("refId") for t in p.get("targets", [])]
        if len(refs) != len(set(refs)):
            problems.append(f"{where}: duplicate refIds {refs}")
        g = p.get("gridPos")
        if not g:
            problems.append(f"{where}: no gridPos")
            continue
        x, y, w, h = g["x"], g["y"], g["w"], g["h"]
        if x < 0 or y < 0 or w < 1 or h < 1 or x + w > 24:
            problems.append(f"{where}: gridPos {g} is outside the 24-column grid")
        for other, ox, oy, ow, oh in boxes:
            if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                problems.append(f"{where}: overlaps {other}")
        boxes.append((where, x, y, w, h))
    return problems


def datasource_problems(where: str, ds: Any, datasources: dict[str, str]) -> list[str]:
    """A datasource reference: absent, Grafana's own, or provisioned with its type."""
    if ds is None:
        return []
    if not isinstance(ds, dict):
        return [f"{where}: datasource {ds!r} is not a {{type, uid}} reference"]
    uid = ds.get("uid")
    if uid in GRAFANA_BUILTIN_DS:
        return []
    if uid not in datasources:
        return [f"{where}: datasource uid {uid!r} is not provisioned (have {sorted(datasources)})"]
    if ds.get("type") not in (None, datasources[uid]):
        return [
            f"{where}: datasource {uid!r} has type {datasources[uid]!r}, not {ds.get('type')!r}"
        ]
    return []


# ------------------------------------------------------------------ SQL check

TIME_FILTER = re.compile(r"\$__timeFilter\(([^)]+)\)")
TIME_GROUP = re.compile(r"\$__timeGroup(Alias)?\(([^,]+),\s*'?(\d+)([smhd])'?\)")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The time range the queries run with: everything LinkDB can hold.
SQL_FROM = "'2000-01-01T00:00:00Z'::timestamptz"
SQL_TO = "now() + interval '1 day'"


def expand_sql(text: str, variables: dict[str, list[str]]) -> str:
    text = TIME_FILTER.sub(
        lambda m: f"{m.group(1)} BETWEEN {SQL_FROM} AND {SQL_TO}",
        text,
    )

    def group(m: re.Match[str]) -> str:
        n = int(m.group(3)) * UNIT_S[m.group(4)]
        g = f"to_timestamp(floor(extract(epoch from {m.group(2)}) / {n}) * {n})"
        return f'{g} AS "time"' if m.group(1) else g

    text = TIME_GROUP.sub(group, text)

    def var(m: re.Match[str]) -> str:
        name = m.group(0).strip("${}[]").split(":")[0]
        if name not in variables:
            raise CheckError(f"unknown variable {m.group(0)} in {text!r}")
        vals = variables[name]
        return ", ".join("'" + v.replace("'", "''") + "'" for v in vals) if vals else "NULL"

    return TEMPLATE_VARS.sub(var, text)


def check_sql(paths: list[Path], url: str, uid: str, expect_rows: list[str]) -> list[str]:
    problems: list[str] = []
    seen_titles: set[str] = set()
    queries = 0
    with pg_connect(url, autocommit=False) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        conn.execute("SET statement_timeout = 30000")

        def run(where: str, q: str) -> list[tuple[Any, ...]] | None:
            nonlocal queries
            queries += 1
            try:
                with conn.transaction():
                    return list(conn.execute(q.encode()).fetchall())
            except psycopg.Error as e:
                problems.append(f"{where}: LinkDB refused the query: {e}".splitlines()[0])
                return None

        for path in paths:
            d = json.loads(path.read_text())
            variables: dict[str, list[str]] = {}
            for v in d.get("templating", {}).get("list", []):
                ds = v.get("datasource")
                if v.get("type") == "query" and isinstance(ds, dict) and ds.get("uid") == uid:
                    rows = run(f"{path.name}: variable {v['name']}", str(v["query"]))
                    variables[v["name"]] = [str(r[0]) for r in rows or []]
                    print(
                        f"  {path.name}: variable {v['name']}: {len(variables[v['name']])} values"
                    )
            for p in panels_of(d):
                for t in p.get("targets", []):
                    ds = t.get("datasource") or p.get("datasource")
                    if not (isinstance(ds, dict) and ds.get("uid") == uid and "rawSql" in t):
                        continue
                    where = f"{path.name}: panel {p.get('title')!r} {t.get('refId')}"
                    try:
                        q = expand_sql(t["rawSql"], variables)
                    except CheckError as err:
                        problems.append(f"{where}: {err}")
                        continue
                    rows = run(where, q)
                    if rows is None:
                        continue
                    print(f"  {where}: {len(rows)} rows")
                    if p.get("title") in expect_rows:
                        seen_titles.add(p["title"])
                        if not rows:
                            problems.append(f"{where}: no rows, but --expect-rows names it")
    for t in set(expect_rows) - seen_titles:
        problems.append(f"--expect-rows {t!r}: no LinkDB panel has that title")
    print(f"sql: {queries} LinkDB queries ran")
    return problems


# ------------------------------------------------------------------ families check


def family_types(text: str, src: str) -> dict[str, str]:
    """Metric family name -> type, from the ``# TYPE`` lines of an exposition."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) < 4:
                raise CheckError(f"{src}: malformed TYPE line: {line[:80]!r}")
            out[parts[2]] = parts[3].lower()
    if not out:
        raise CheckError(f"{src}: no metric family (# TYPE line): not a /metrics dump")
    return out


def check_families(committed: Path, live: list[Path], refresh: str | None) -> list[str]:
    problems: list[str] = []
    live_names = {p.name for p in live}
    for fixture in sorted(committed.glob("*.prom")):
        if fixture.name not in live_names:
            problems.append(f"{fixture}: no live dump {fixture.name} to compare with")
    for path in live:
        fixture = committed / path.name
        if not fixture.is_file():
            problems.append(f"{path.name}: no committed dump {fixture}")
            continue
        now = family_types(path.read_text(), str(path))
        then = family_types(fixture.read_text(), str(fixture))
        for name in sorted(now.keys() - then.keys()):
            problems.append(f"{path.name}: {name} ({now[name]}) is exported but not in {fixture}")
        for name in sorted(then.keys() - now.keys()):
            problems.append(
                f"{path.name}: {name} ({then[name]}) is in {fixture} but no longer exported"
            )
        for name in sorted(now.keys() & then.keys()):
            if now[name] != then[name]:
                problems.append(
                    f"{path.name}: {name} is a {now[name]} now, a {then[name]} in {fixture}"
                )
    if problems:
        how = f": {refresh}" if refresh else ""
        problems.append(
            f"the committed /metrics dumps in {committed} are stale; refresh them{how} "
            "(and commit them)"
        )
    return problems


# ------------------------------------------------------------------ main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("metrics", help="PromQL metric names vs the services' /metrics")
    m.add_argument("--rules", type=Path, nargs="*", default=[], help="Prometheus rule files")
    m.add_argument("--dashboards", type=Path, nargs="*", default=[], help="Grafana dashboard JSON")
    src = m.add_mutually_exclusive_group(required=True)
    src.add_argument("--exposition", nargs="+", metavar="SOURCE", help="/metrics dumps or URLs")
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus scraping the services")
    qu = sub.add_parser("query", help="evaluate the dashboards' PromQL on a Prometheus")
    qu.add_argument("--prometheus", required=True, metavar="URL")
    qu.add_argument("--var", action="append", default=[], metavar="NAME=VALUE")
    qu.add_argument("--allow-empty", action="append", default=[], metavar="REGEX")
    qu.add_argument("dashboards", type=Path, nargs="+")
    pr = sub.add_parser("promql-rules", help="the dashboards' PromQL as a rule file")
    pr.add_argument("dashboards", type=Path, nargs="+")
    al = sub.add_parser("alerts", help="alert labels, annotations, runbooks and unit tests")
    al.add_argument("--rules", type=Path, nargs="+", required=True)
    al.add_argument("--tests", type=Path, nargs="+", required=True)
    al.add_argument("--scrape-config", type=Path, required=True)
    d = sub.add_parser("dashboards", help="dashboard structure and datasources")
    d.add_argument("--provisioning", type=Path, required=True, help="Grafana provisioning dir")
    d.add_argument("--schema-version", type=int, required=True)
    d.add_argument("dashboards", type=Path, nargs="+")
    s = sub.add_parser("sql", help="run the dashboards' LinkDB queries")
    s.add_argument("--database-url", required=True)
    s.add_argument("--datasource-uid", default="linkdb")
    s.add_argument("--expect-rows", action="append", default=[], metavar="PANEL_TITLE")
    s.add_argument("dashboards", type=Path, nargs="+")
    f = sub.add_parser("families", help="live /metrics dumps vs the committed ones")
    f.add_argument("--committed", type=Path, required=True, help="dir of the committed dumps")
    f.add_argument("--refresh", metavar="CMD", help="the command that refreshes them")
    f.add_argument("live", type=Path, nargs="+", help="dumps scraped from the running services")
    return p


def findings(a: argparse.Namespace) -> list[str]:
    """The problems one checking subcommand finds."""
    if a.cmd == "metrics":
        exprs, recorded = rule_exprs(a.rules)
        exprs += dashboard_exprs(a.dashboards)
        exported = Exported()
        for src in a.exposition or []:
            parse_exposition(read_source(src), exported, src)
        if a.prometheus:
            read_prometheus(a.prometheus, exported)
        return check_metrics(exprs, recorded, exported)
    if a.cmd == "query":
        variables = dict(v.split("=", 1) for v in a.var)
        return check_query(a.dashboards, a.prometheus, variables, a.allow_empty)
    if a.cmd == "alerts":
        return check_alerts(a.rules, a.tests, a.scrape_config)
    if a.cmd == "dashboards":
        return check_dashboards(a.dashboards, provisioned(a.provisioning), a.schema_version)
    if a.cmd == "families":
        return check_families(a.committed, a.live, a.refresh)
    return check_sql(a.dashboards, a.database_url, a.datasource_uid, a.expect_rows)


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        if a.cmd == "promql-rules":
            sys.stdout.write(promql_rules(a.dashboards))
            return 0
        problems = findings(a)
    except (CheckError, OSError) as err:
        print(f"check_observability {a.cmd}: {err}", file=sys.stderr)
        return 1
    for line in problems:
        print(f"FINDING {line}", file=sys.stderr)
    print(f"check_observability {a.cmd}: {len(problems)} findings")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
