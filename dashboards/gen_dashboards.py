"""Generate the Grafana dashboards in dashboards/ (committed; regenerate with
``python3 dashboards/gen_dashboards.py``, check with ``--check``).

Five dashboards, all on the provisioned datasources (uids ``prometheus`` and
``linkdb``, services/grafana/provisioning/datasources/polycorn.yml):

- ``polycorn-fleet``: trains online, per-carrier goodput and RTT, path
  rejections (hof-reject) and path state, reinjected and redundant bytes.
- ``polycorn-train``: one train's paths over time, its memory budget and
  flow control (variables ``train`` and ``side``).
- ``polycorn-handover-map``: handover failures on a Geomap, from LinkDB.
- ``polycorn-trainer``: the trainer's validation over model versions.
- ``polycorn-services``: ingest, linkdb-api and the telemetry pipeline.

Every PromQL expression names only metrics the services export
(scripts/check_observability.py checks them against the running services)
or the recording rules of services/prometheus/rules/polycorn.rules.yml;
every SQL query runs against LinkDB's real tables (the same script runs them
against a migrated LinkDB). The JSON is typed against @grafana/schema by
make validate-platform (testbed/harness/suites/observability).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 42  # @grafana/schema 13.2.3's defaultDashboard.schemaVersion
PROM = {"type": "prometheus", "uid": "prometheus"}
LINKDB = {"type": "grafana-postgresql-datasource", "uid": "linkdb"}
OUT = Path(__file__).resolve().parent

Json = dict[str, Any]


class Board:
    """Lays panels out left to right, in rows of 24 grid units."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _place(self, w: int, h: int) -> Json:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append(
            {
                "type": "row",
                "id": self._id(),
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            }
        )
        self.y += 1

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i

    def add(self, panel: Json, w: int, h: int) -> None:
        panel = {"id": self._id(), "gridPos": self._place(w, h), **panel}
        self.panels.append(panel)


def prom(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False) -> Json:
    t: Json = {"refId": ref, "datasource": PROM, "expr": expr, "legendFormat": legend}
    if instant:
        t["instant"] = True
        t["range"] = False
    else:
        t["range"] = True
    return t


def sql(query: str, ref: str = "A", fmt: str = "table") -> Json:
    return {
        "refId": ref,
        "datasource": LINKDB,
        "editorMode": "code",
        "format": fmt,
        "rawQuery": True,
        "rawSql": " ".join(query.split()),
    }


def field_defaults(unit: str, *, decimals: int | None = None, max_: float | None = None) -> Json:
    d: Json = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}]},
    }
    if decimals is not None:
        d["decimals"] = decimals
    if max_ is not None:
        d["max"] = max_
    return d


def timeseries(
    title: str, targets: list[Json], unit: str, description: str = "", stack: bool = False
) -> Json:
    custom: Json = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10 if stack else 0,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": targets[0]["datasource"],
        "targets": targets,
        "fieldConfig": {"defaults": {**field_defaults(unit), "custom": custom}, "overrides": []},
        "options": {
            "legend": {
                "calcs": [],
                "displayMode": "list",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    target: Json,
    unit: str = "none",
    description: str = "",
    steps: list[tuple[str, float | None]] | None = None,
) -> Json:
    defaults = field_defaults(unit)
    defaults["color"] = {"mode": "thresholds"}
    if steps:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": c, "value": v} for c, v in steps],
        }
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": target["datasource"],
        "targets": [target],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "percentChangeColorMode": "standard",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        },
    }


def state_timeline(
    title: str, targets: list[Json], description: str = "", updown: bool = True
) -> Json:
    """Values 0/1 shown as down/up (updown), or counts coloured red at 0."""
    defaults = field_defaults("none")
    defaults["color"] = {"mode": "thresholds"}
    defaults["thresholds"] = {
        "mode": "absolute",
        "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
    }
    defaults["mappings"] = [
        {
            "type": "value",
            "options": {
                "0": {"text": "down", "color": "red", "index": 0},
                "1": {"text": "up", "color": "green", "index": 1},
            },
        }
    ]
    if not updown:
        defaults["mappings"] = []
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": targets[0]["datasource"],
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "calcs": [],
                "displayMode": "list",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"mode": "single", "sort": "none"},
            "mergeValues": True,
            "rowHeight": 0.9,
            "showValue": "never",
            "alignValue": "left",
        },
    }


def table(title: str, targets: list[Json], description: str = "", unit: str = "none") -> Json:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": targets[0]["datasource"],
        "targets": targets,
        "fieldConfig": {"defaults": field_defaults(unit), "overrides": []},
        "options": {"frameIndex": 0, "showHeader": True, "cellHeight": "sm"},
    }


def dashboard(uid: str, title: str, description: str, board: Board, **extra: Any) -> Json:
    d: Json = {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["polycorn"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "utc",
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [
            {
                "title": "Polycorn",
                "type": "dashboards",
                "tags": ["polycorn"],
                "asDropdown": True,
                "icon": "external link",
                "includeVars": False,
                "keepTime": True,
                "targetBlank": False,
                "tooltip": "",
            }
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": []},
        "panels": board.panels,
    }
    d.update(extra)
    return d


# ------------------------------------------------------------------ fleet


def fleet() -> Json:
    b = Board()
    b.row("Fleet")
    b.add(
        stat(
            "Trains online",
            prom('count(polycorn:train_paths_up:sum{job="polycorn-proxy"} > 0) or vector(0)'),
            description="Trains whose proxy has at least one established subflow.",
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Trains with every path down",
            prom('count(polycorn:train_paths_up:sum{job="polycorn-proxy"} == 0) or vector(0)'),
            description="Trains whose proxy has a session but no established subflow.",
            steps=[("green", None), ("red", 1)],
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Proxies up",
            prom('sum(up{job="polycorn-proxy"}) or vector(0)'),
            description="Proxy targets Prometheus scraped successfully.",
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Passengers connected",
            prom('sum(polycorn_conn_active{job="polycorn-proxy"}) or vector(0)'),
            description="Passenger connections open at the proxies.",
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Reinjected share (fleet, downstream)",
            prom(
                'sum(polycorn:train_reinjected_bytes:rate5m{job="polycorn-proxy"})'
                ' / sum(polycorn:train_data_bytes:rate5m{job="polycorn-proxy"})'
            ),
            unit="percentunit",
            steps=[("green", None), ("orange", 0.1), ("red", 0.3)],
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Polycorn alerts firing",
            prom('count(ALERTS{alertstate="firing", alertname=~"Polycorn.*"}) or vector(0)'),
            steps=[("green", None), ("red", 1)],
        ),
        4,
        4,
    )
    b.add(
        state_timeline(
            "Paths up per train (proxy)",
            [prom('polycorn:train_paths_up:sum{job="polycorn-proxy"}', "{{train}}")],
            description="Established subflows per train, as its proxy sees them (red: none).",
            updown=False,
        ),
        24,
        7,
    )
    b.row("Carriers")
    b.add(
        timeseries(
            "Goodput per carrier, downstream (proxy)",
            [
                prom(
                    'sum by (name) (polycorn:carrier_goodput_bytes:rate1m{job="polycorn-proxy"})',
                    "{{name}}",
                )
            ],
            "Bps",
            "First-time passenger bytes per second sent towards the trains, per carrier "
            "(neither reinjections nor redundant copies).",
            stack=True,
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Goodput per carrier, upstream (relay)",
            [
                prom(
                    'sum by (name) (polycorn:carrier_goodput_bytes:rate1m{job="polycorn-relay"})',
                    "{{name}}",
                )
            ],
            "Bps",
            "First-time passenger bytes per second the trains send, per carrier.",
            stack=True,
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Smoothed RTT per carrier (median and worst train)",
            [
                prom(
                    'quantile by (name) (0.5, polycorn_path_srtt_seconds{job="polycorn-proxy"}'
                    " and on (job, train, path) polycorn_path_up == 1)",
                    "{{name}} median",
                ),
                prom(
                    'max by (name) (polycorn_path_srtt_seconds{job="polycorn-proxy"}'
                    " and on (job, train, path) polycorn_path_up == 1)",
                    "{{name}} max",
                    ref="B",
                ),
            ],
            "s",
            "Data-level smoothed RTT of established paths, measured by the proxies.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Paths up per carrier",
            [
                prom('sum by (name) (polycorn_path_up{job="polycorn-proxy"})', "{{name}} up"),
                prom(
                    'count by (name) (polycorn_path_up{job="polycorn-proxy"})',
                    "{{name}} configured",
                    ref="B",
                ),
            ],
            "none",
            "Established subflows per carrier across the fleet, against the paths the trains have.",
        ),
        12,
        8,
    )
    b.row("Scheduling")
    b.add(
        timeseries(
            "Path rejections (hof-reject)",
            [
                prom(
                    "sum by (job, event) (rate(polycorn_sched_schedulerlet_events_total"
                    '{schedulerlet="hof-reject", event!="held_ms"}[$__rate_interval]))',
                    "{{job}} {{event}}",
                ),
                prom(
                    "sum by (job) (rate(polycorn_sched_schedulerlet_events_total"
                    '{schedulerlet="tail-reject", event="deselected"}[$__rate_interval]))',
                    "{{job}} tail-reject deselected",
                    ref="B",
                ),
            ],
            "ops",
            "HRSCH's handover-failure filter keeping paths out of scheduling ahead of a predicted "
            "failure (rejections) and releasing them after max_hold (rejections_expired); "
            "tail-reject deselecting slow paths for a flow's tail.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Path state changes",
            [
                prom(
                    "sum by (name) (increase(polycorn_path_state_changes_total"
                    '{job="polycorn-proxy"}[$__rate_interval]))',
                    "{{name}}",
                )
            ],
            "none",
            "Subflow up/down transitions per carrier (proxy side): handovers that break paths.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Reinjected and redundant bytes",
            [
                prom("sum by (job) (polycorn:train_reinjected_bytes:rate5m)", "{{job}} reinjected"),
                prom(
                    "sum by (job) (polycorn:train_redundant_bytes:rate5m)",
                    "{{job}} redundant",
                    ref="B",
                ),
            ],
            "Bps",
            "Passenger bytes sent again after an RTO (reinjected) or as copies on a second path "
            "(redundant), both directions.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Reinjected share per train",
            [prom("polycorn:train_reinjection:ratio5m", "{{train}} {{job}}")],
            "percentunit",
            "Reinjected bytes over passenger bytes sent; "
            "PolycornReinjectionStorm fires above 30 %.",
        ),
        12,
        8,
    )
    return dashboard(
        "polycorn-fleet",
        "Polycorn / Fleet overview",
        "Every train at a glance: which are online, how each carrier performs, what the "
        "scheduler rejects and how much it sends twice.",
        b,
    )


# ------------------------------------------------------------------ one train


def train() -> Json:
    t = '{train="$train"}'
    tj = '{train="$train", job="$side"}'
    b = Board()
    b.row("Paths")
    b.add(
        state_timeline(
            "Path state",
            [prom(f"polycorn_path_up{tj}", "{{name}} (path {{path}})")],
            "1 when the subflow is established.",
        ),
        24,
        6,
    )
    b.add(
        timeseries(
            "Passenger bytes sent per path",
            [
                prom(
                    f"sum by (name) (rate(polycorn_path_data_bytes_total{tj}[$__rate_interval]))",
                    "{{name}}",
                )
            ],
            "Bps",
            "Includes reinjections and redundant copies.",
            stack=True,
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Delivery-rate estimate per path",
            [prom(f"polycorn_path_delivery_rate_bytes_per_second{tj}", "{{name}}")],
            "Bps",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Smoothed RTT and variation per path",
            [
                prom(f"polycorn_path_srtt_seconds{tj}", "{{name}} srtt"),
                prom(f"polycorn_path_rttvar_seconds{tj}", "{{name}} rttvar", ref="B"),
                prom(f"polycorn_path_rtt_max_seconds{tj}", "RTT_max (live paths)", ref="C"),
            ],
            "s",
            "RTT_max, the largest smoothed RTT of the live paths, is the round trip "
            "receive-window autotuning measures over.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Window and bytes in flight per path",
            [
                prom(f"polycorn_path_cwnd_bytes{tj}", "{{name}} cwnd"),
                prom(f"polycorn_path_in_flight_bytes{tj}", "{{name}} in flight", ref="B"),
                prom(f"polycorn_path_queued_bytes{tj}", "{{name}} queued", ref="C"),
            ],
            "bytes",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Reinjected and redundant bytes per path",
            [
                prom(
                    f"sum by (name) (rate(polycorn_path_reinjected_bytes_total{tj}"
                    "[$__rate_interval]))",
                    "{{name}} reinjected",
                ),
                prom(
                    f"sum by (name) (rate(polycorn_path_redundant_bytes_total{tj}"
                    "[$__rate_interval]))",
                    "{{name}} redundant",
                    ref="B",
                ),
            ],
            "Bps",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Retransmission timeouts per path",
            [
                prom(
                    f"sum by (name) (increase(polycorn_path_rto_total{tj}[$__rate_interval]))",
                    "{{name}} RTOs",
                ),
                prom(f"polycorn_path_consecutive_rtos{tj}", "{{name}} consecutive", ref="B"),
            ],
            "none",
        ),
        12,
        8,
    )
    b.row("Scheduler and failure table")
    b.add(
        timeseries(
            "Schedulerlet events",
            [
                prom(
                    "sum by (schedulerlet, event) "
                    "(rate(polycorn_sched_schedulerlet_events_total"
                    f'{tj[:-1]}, event!="held_ms"}}[$__rate_interval]))',
                    "{{schedulerlet}} {{event}}",
                )
            ],
            "ops",
            "hof-reject rejections (paths held out ahead of a predicted handover failure), "
            "tail-reject deselections, idle-inject bursts (hof-reject's held_ms, a duration, "
            "is not an event and not drawn).",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Failure-location table in use",
            [
                prom(f"polycorn_failure_table_version{t}", "{{job}} version"),
                prom(f"polycorn_failure_table_entries{t}", "{{job}} entries", ref="B"),
            ],
            "none",
            "The table HRSCH's hof-reject acts on, at the relay and the proxy.",
        ),
        12,
        8,
    )
    flow_control(b, tj)
    b.row("Passengers and telemetry (relay)")
    b.add(
        timeseries(
            "Passenger traffic through the relay",
            [
                prom(
                    f"sum(rate(polycorn_capture_up_bytes_total{t}[$__rate_interval]))",
                    "up (passengers to Internet)",
                ),
                prom(
                    f"sum(rate(polycorn_capture_down_bytes_total{t}[$__rate_interval]))",
                    "down",
                    ref="B",
                ),
            ],
            "Bps",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Telemetry spool",
            [
                prom(f"polycorn_telemetry_spool_records{t}", "records unconfirmed"),
                prom(f"polycorn_telemetry_spool_in_flight{t}", "in flight", ref="B"),
                prom(
                    "sum by (class) "
                    f"(increase(polycorn_telemetry_spool_dropped_total{t}[$__rate_interval]))",
                    "dropped {{class}}",
                    ref="C",
                ),
            ],
            "none",
            "Records the relay keeps until the proxy confirms Kafka has them.",
        ),
        12,
        8,
    )
    variables = [
        {
            "type": "query",
            "name": "train",
            "label": "Train",
            "datasource": PROM,
            "query": {"query": "label_values(polycorn_path_up, train)", "refId": "train"},
            "refresh": 2,
            "sort": 1,
            "includeAll": False,
            "multi": False,
            "options": [],
        },
        {
            "type": "custom",
            "name": "side",
            "label": "Seen by",
            "query": "polycorn-proxy,polycorn-relay",
            "current": {"text": "polycorn-proxy", "value": "polycorn-proxy"},
            "options": [
                {"text": "polycorn-proxy", "value": "polycorn-proxy", "selected": True},
                {"text": "polycorn-relay", "value": "polycorn-relay", "selected": False},
            ],
            "includeAll": False,
            "multi": False,
        },
    ]
    return dashboard(
        "polycorn-train",
        "Polycorn / Train paths",
        "One train's paths, memory budget and flow control over time, as its proxy (downstream) "
        "or its relay (upstream) sees them.",
        b,
        templating={"list": variables},
    )


def flow_control(b: Board, tj: str) -> None:
    """The memory budget and the passenger connections' windows and buffers
    (docs/architecture.md, "Flow control and memory")."""
    b.row("Memory and flow control")
    b.add(
        timeseries(
            "Memory budget",
            [
                prom(f"polycorn_mem_budget_used_bytes{tj}", "used"),
                prom(f"polycorn_mem_budget_peak_bytes{tj}", "peak", ref="B"),
                prom(f"polycorn_mem_budget_bytes{tj}", "{{level}} level", ref="C"),
            ],
            "bytes",
            "Send buffers plus receive windows, held or promised, against the budget's "
            "levels (high is --mem-budget; low is half of it, pressure three quarters). "
            "Below low windows grow freely, below pressure to a fair share; above "
            "pressure they shrink; at high nothing gets more than its floor. A proxy's "
            "budget is shared by its sessions.",
        ),
        12,
        8,
    )
    b.add(
        stat(
            "Memory pressure",
            prom(f"max(polycorn_mem_budget_pressure{tj})"),
            description="0 free (below low), 1 moderate (below pressure), 2 pressure "
            "(windows shrink), 3 high (no growth beyond the floors; alert "
            "PolycornMemoryBudgetHigh after 5 minutes).",
            steps=[("green", None), ("yellow", 1), ("orange", 2), ("red", 3)],
        ),
        4,
        8,
    )
    b.add(
        timeseries(
            "Window growths and budget refusals",
            [
                prom(
                    f"sum(rate(polycorn_conn_window_growths_total{tj}[$__rate_interval]))",
                    "window growths",
                ),
                prom(
                    f"sum(rate(polycorn_mem_budget_grants_denied_total{tj}[$__rate_interval]))",
                    "grants denied",
                    ref="B",
                ),
            ],
            "ops",
            "Receive windows grown by autotuning, and window growths or passenger writes "
            "the budget refused or cut.",
        ),
        8,
        8,
    )
    b.add(
        timeseries(
            "Receive windows",
            [
                prom(f"polycorn_conn_window_bytes{tj}", "sum of windows"),
                prom(f"polycorn_conn_window_max_bytes{tj}", "largest window", ref="B"),
                prom(f"polycorn_conn_out_of_order_bytes{tj}", "held out of order", ref="C"),
            ],
            "bytes",
            "Windows start at --conn-window-initial and double while more than half a "
            "window moves (read, or arrived while the passenger keeps up) per RTT_max, "
            "up to --conn-window. Out of order: "
            "bytes held above a gap, waiting for a slower path.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Window bytes grown and reclaimed",
            [
                prom(
                    f"sum(rate(polycorn_conn_window_growth_bytes_total{tj}[$__rate_interval]))",
                    "grown",
                ),
                prom(
                    f"sum(rate(polycorn_mem_budget_reclaimed_bytes_total{tj}[$__rate_interval]))",
                    "reclaimed under pressure",
                    ref="B",
                ),
            ],
            "Bps",
            "Reclaimed: window bytes taken back, largest windows first, while the budget "
            "is above its pressure level.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Passenger bytes on the send side",
            [
                prom(f"polycorn_conn_unsent_bytes{tj}", "unsent"),
                prom(f"polycorn_conn_in_flight_bytes{tj}", "in flight", ref="B"),
            ],
            "bytes",
            "Unsent: written by passengers, not yet placed on a path (kept to about two "
            "round trips of each connection's delivery rate). In flight: placed, not yet "
            "acknowledged.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Connections held back by the peer's window or by send room",
            [
                prom(
                    f"sum(rate(polycorn_conn_window_limited_seconds_total{tj}[$__rate_interval]))",
                    "window-limited",
                ),
                prom(
                    f"sum(rate(polycorn_conn_send_limited_seconds_total{tj}[$__rate_interval]))",
                    "send-limited",
                    ref="B",
                ),
            ],
            "none",
            "Seconds per second that connections had data waiting only for the peer's "
            "receive window (window-limited), or passengers' writes waited for send room "
            "(send-limited): on average, how many connections were held back. Sustained "
            "window-limited: windows are capped (--conn-window) or shrunk by memory pressure. "
            "Send-limited is normal for a download faster than the carriers (the paths are "
            "the limit); with the budget at high it means memory is.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Head-of-line stalls",
            [
                prom(
                    "sum by (at_least) (rate(polycorn_conn_hol_stalls_total"
                    f'{tj[:-1]}, at_least!="0s"}}[$__rate_interval]))',
                    "at least {{at_least}}",
                ),
                prom(
                    f"sum(rate(polycorn_conn_hol_stall_seconds_total{tj}[$__rate_interval]))",
                    "stalled s/s",
                    ref="B",
                ),
            ],
            "none",
            "Stalls per second that lasted at least 0.2 s or 1 s: received bytes waited above "
            "a gap while the in-order point stood still, so the passenger saw nothing new "
            "(relay: downloads; proxy: uploads). Short stalls are normal reordering between "
            "carriers; long ones mean a carrier went slow or dark under a connection's head. "
            "Stalled s/s: summed stall length per second.",
        ),
        12,
        8,
    )


# ------------------------------------------------------------------ handover-failure map

CARRIER_FILTER = "carrier IN ($carrier)"


def geomap(
    title: str, target: Json, description: str, color_field: str, size_field: str | None
) -> Json:
    style: Json = {
        "color": {"field": color_field, "fixed": "dark-red"},
        "opacity": 0.6,
        "symbol": {"fixed": "img/icons/marker/circle.svg", "mode": "fixed"},
        "size": {"fixed": 5, "min": 3, "max": 15},
    }
    if size_field:
        style["size"]["field"] = size_field
    return {
        "type": "geomap",
        "title": title,
        "description": description,
        "datasource": LINKDB,
        "targets": [target],
        "fieldConfig": {
            "defaults": {
                "color": {"mode": "continuous-GrYlRd"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}]},
            },
            "overrides": [],
        },
        "options": {
            "view": {"id": "fit", "lat": 0, "lon": 0, "zoom": 5, "allLayers": True},
            "controls": {"showZoom": True, "mouseWheelZoom": True, "showAttribution": True},
            "basemap": {"type": "default", "name": "Basemap"},
            "layers": [
                {
                    "type": "markers",
                    "name": title,
                    "tooltip": True,
                    "location": {
                        "mode": "coords",
                        "latitude": "latitude",
                        "longitude": "longitude",
                    },
                    "config": {"showLegend": True, "style": style},
                }
            ],
            "tooltip": {"mode": "details"},
        },
    }


def routes_map() -> Json:
    """Routes (LinkDB's reference lines, every vertex as a small grey dot)
    and the failure table's predicted failure points (the latest cell model
    of each cell with a point on a route), in two layers of one Geomap."""
    panel = geomap(
        "Routes and predicted failure points",
        sql(
            """
            SELECT ST_Y(p.geom) AS latitude, ST_X(p.geom) AS longitude, r.id AS route,
                   r.name AS name
            FROM routes r
            CROSS JOIN LATERAL ST_DumpPoints(ST_Segmentize(r.geog, 200)::geometry) AS p
            LIMIT 50000
            """,
            ref="A",
        ),
        "LinkDB's routes (polycorn-ingest import-routes; a dot every 200 m at most) and, in "
        "red, where the trainer predicts each cell's handovers fail (cell_models, latest model "
        "per cell, map-matched cells only).",
        "route",
        None,
    )
    panel["targets"].append(
        sql(
            f"""
            SELECT ST_Y(m.predicted_failure_geog::geometry) AS latitude,
                   ST_X(m.predicted_failure_geog::geometry) AS longitude,
                   c.carrier, cell_name(c.cell_id) AS cell, c.cell_id,
                   c.direction::text AS direction, m.route_id AS route,
                   round(m.predicted_failure_track_m::numeric, 1) AS position_m,
                   m.failure_rate
            FROM (SELECT DISTINCT ON (cell) * FROM cell_models ORDER BY cell, model_id DESC) m
            JOIN cells c ON c.id = m.cell
            WHERE m.predicted_failure_geog IS NOT NULL AND c.{CARRIER_FILTER}
            LIMIT 5000
            """,
            ref="B",
        )
    )
    (routes_layer,) = panel["options"]["layers"]
    routes_layer["name"] = "Routes"
    routes_layer["filterData"] = {"id": "byRefId", "options": "A"}
    routes_layer["config"]["style"].update(
        {"color": {"fixed": "text"}, "size": {"fixed": 2}, "opacity": 0.5}
    )
    failures_layer = {
        "type": "markers",
        "name": "Predicted failure points",
        "tooltip": True,
        "filterData": {"id": "byRefId", "options": "B"},
        "location": {"mode": "coords", "latitude": "latitude", "longitude": "longitude"},
        "config": {
            "showLegend": True,
            "style": {
                "color": {"field": "failure_rate", "fixed": "dark-red"},
                "opacity": 0.8,
                "symbol": {"fixed": "img/icons/marker/triangle.svg", "mode": "fixed"},
                "size": {"fixed": 7},
            },
        },
    }
    panel["options"]["layers"].append(failures_layer)
    return panel


def handover_map() -> Json:
    b = Board()
    b.add(
        geomap(
            "Handover failures",
            sql(
                f"""
                SELECT ST_Y(geog::geometry) AS latitude, ST_X(geog::geometry) AS longitude,
                       start_time AS time, train_id, carrier,
                       cell_name(source_cell_id) AS source_cell,
                       cell_name(target_cell_id) AS target_cell, source_cell_id, target_cell_id,
                       duration_ms, rsrp_dbm
                FROM handovers
                WHERE outcome = 'failure' AND $__timeFilter(start_time) AND {CARRIER_FILTER}
                ORDER BY start_time DESC
                LIMIT 5000
                """
            ),
            "Where handovers failed (LinkDB handovers, outcome failure), "
            "in the dashboard's time range.",
            "duration_ms",
            None,
        ),
        14,
        14,
    )
    b.add(
        geomap(
            "Failure rate per cell",
            sql(
                f"""
                SELECT ST_Y(earliest_ho_geog::geometry) AS latitude,
                       ST_X(earliest_ho_geog::geometry) AS longitude,
                       carrier, cell_name(cell_id) AS cell, cell_id,
                       direction::text AS direction, handovers, failures,
                       failures::float / NULLIF(handovers, 0) AS failure_rate
                FROM cells
                WHERE earliest_ho_geog IS NOT NULL AND handovers > 0 AND {CARRIER_FILTER}
                ORDER BY failures DESC
                LIMIT 5000
                """
            ),
            "Each cell (carrier, cell id, direction of travel) at its earliest handover position, "
            "coloured by the share of its handovers that failed.",
            "failure_rate",
            "handovers",
        ),
        10,
        14,
    )
    b.add(routes_map(), 24, 12)
    b.add(
        timeseries(
            "Handovers and failures per hour",
            [
                sql(
                    f"""
                    SELECT $__timeGroupAlias(start_time, '1h'),
                           count(*) FILTER (WHERE outcome = 'failure') AS failures,
                           count(*) AS handovers
                    FROM handovers
                    WHERE $__timeFilter(start_time) AND {CARRIER_FILTER}
                    GROUP BY 1 ORDER BY 1
                    """,
                    fmt="time_series",
                )
            ],
            "none",
        ),
        12,
        8,
    )
    b.add(
        table(
            "Cells with the most failures",
            [
                sql(
                    f"""
                    SELECT carrier, cell_name(cell_id) AS cell, cell_id,
                           direction::text AS direction, handovers, failures,
                           round((failures::numeric / NULLIF(handovers, 0)), 3) AS failure_rate,
                           round(earliest_ho_track_m::numeric, 1) AS earliest_ho_track_m,
                           last_seen
                    FROM cells
                    WHERE failures > 0 AND {CARRIER_FILTER}
                    ORDER BY failures DESC, handovers DESC
                    LIMIT 50
                    """
                )
            ],
        ),
        12,
        8,
    )
    variables = [
        {
            "type": "query",
            "name": "carrier",
            "label": "Carrier",
            "datasource": LINKDB,
            "query": "SELECT DISTINCT carrier FROM cells ORDER BY 1",
            "refresh": 1,
            "sort": 1,
            "includeAll": True,
            "multi": True,
            "current": {"text": "All", "value": "$__all"},
            "options": [],
        }
    ]
    return dashboard(
        "polycorn-handover-map",
        "Polycorn / Handover-failure map",
        "Where handovers fail, from LinkDB (PostGIS): every failed handover, and each cell's "
        "failure rate at its earliest handover position.",
        b,
        templating={"list": variables},
        refresh="5m",
        time={"from": "now-7d", "to": "now"},
    )


# ------------------------------------------------------------------ trainer


VALIDATION_KEYS = ("failure_correct", "failure_late", "failure_early", "success_correct")


def trainer() -> Json:
    b = Board()
    b.row("Last run (Prometheus)")
    b.add(
        stat(
            "Since the last successful run",
            prom("time() - max(polycorn_trainer_last_success_timestamp_seconds)", instant=True),
            unit="s",
            steps=[("green", None), ("orange", 7200), ("red", 10800)],
            description="PolycornTrainerStale fires above 3 hours.",
        ),
        6,
        4,
    )
    b.add(stat("Model", prom("max(polycorn_trainer_model_id)")), 3, 4)
    b.add(stat("Table version", prom("max(polycorn_trainer_table_version)")), 3, 4)
    b.add(stat("Table entries", prom("max(polycorn_trainer_table_entries)")), 4, 4)
    b.add(stat("Cells with an SVM", prom("max(polycorn_trainer_cells_fitted)")), 4, 4)
    b.add(stat("Handovers learned from", prom("max(polycorn_trainer_handovers_used)")), 4, 4)
    b.add(
        timeseries(
            "Validation of the last run",
            [prom("max by (metric) (polycorn_trainer_validation_ratio)", "{{metric}}")],
            "percentunit",
            "Leave-one-trip-out validation (fractions): failures predicted correctly, late, "
            "early; successes predicted correctly; per-cell separability.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Runs and their duration",
            [
                prom(
                    "sum by (result) (increase(polycorn_trainer_runs_total[$__rate_interval]))",
                    "{{result}} runs",
                ),
                prom(
                    "histogram_quantile(0.9, sum by (le) (rate(polycorn_trainer_run_seconds_bucket"
                    "[$__rate_interval])))",
                    "p90 run seconds",
                    ref="B",
                ),
            ],
            "none",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Between refits: the follower",
            [
                prom(
                    "histogram_quantile(0.9, sum by (le) (rate("
                    "polycorn_trainer_follow_failure_to_table_seconds_bucket[$__rate_interval])))",
                    "p90 failure to table (s)",
                ),
                prom(
                    "sum(increase(polycorn_trainer_follow_failures_total[$__rate_interval]))",
                    "new failures read",
                    ref="B",
                ),
                prom(
                    "max(polycorn_trainer_follow_backlog_cells)",
                    "cells waiting",
                    ref="C",
                ),
            ],
            "none",
            "polycorn-trainer follow: how long a failure takes to reach a published table (from "
            "its start on the train's clock), the failures it reads and the cells left for the "
            "next poll.",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Cells by model kind",
            [prom("max by (kind) (polycorn_trainer_cells)", "{{kind}}")],
            "none",
            stack=True,
        ),
        12,
        8,
    )
    b.row("Quality over model versions (LinkDB)")
    cols = ", ".join(f"(validation->>'{k}')::float AS {k}" for k in VALIDATION_KEYS)
    b.add(
        timeseries(
            "Validation per model version",
            [
                sql(
                    f"SELECT created_at AS time, {cols} FROM models "
                    "WHERE $__timeFilter(created_at) AND params->>'update' IS NULL ORDER BY 1"
                )
            ],
            "percentunit",
            "models.validation of every refit, at the time it was made (the follower's "
            "updates validate only the cells they refit and are left out).",
        ),
        12,
        8,
    )
    b.add(
        table(
            "Models and their tables",
            [
                sql(
                    f"""
                    SELECT m.id AS model, m.created_at,
                           coalesce(m.params->>'update', 'refit') AS kind,
                           m.trainer_version, m.cells_fitted,
                           m.handovers_used, {cols}, t.version AS table_version,
                           t.entries AS table_entries
                    FROM models m LEFT JOIN failure_tables t ON t.model_id = m.id
                    ORDER BY m.id DESC
                    LIMIT 100
                    """
                )
            ],
        ),
        12,
        8,
    )
    return dashboard(
        "polycorn-trainer",
        "Polycorn / Trainer quality",
        "The trainer's last run from its metrics, and the validation of every model version from "
        "LinkDB (models, failure_tables).",
        b,
        time={"from": "now-30d", "to": "now"},
        refresh="5m",
    )


# ------------------------------------------------------------------ ingest and API


def _ingest_panels(b: Board) -> None:
    """The ingest row: the health stats of both services, then consumption, rows written,
    lag, batch time and errors."""
    b.row("ingest")
    b.add(
        stat(
            "ingest up",
            prom('sum(up{job="polycorn-ingest"}) or vector(0)'),
            steps=[("red", None), ("green", 1)],
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Consumer lag",
            prom('sum(polycorn_ingest_consumer_lag{job="polycorn-ingest"}) or vector(0)'),
            steps=[("green", None), ("orange", 1000), ("red", 10000)],
        ),
        4,
        4,
    )
    b.add(
        stat(
            "Dead letters (1 h)",
            prom("sum(increase(polycorn_ingest_dead_letters_total[1h])) or vector(0)"),
            steps=[("green", None), ("red", 1)],
        ),
        4,
        4,
    )
    b.add(
        stat(
            "End-to-end lag p90",
            prom(
                "histogram_quantile(0.9, sum by (le) "
                "(rate(polycorn_ingest_end_to_end_lag_seconds_bucket[5m])))"
            ),
            unit="s",
        ),
        4,
        4,
    )
    b.add(
        stat(
            "linkdb-api up",
            prom('sum(up{job="polycorn-linkdb-api"}) or vector(0)'),
            steps=[("red", None), ("green", 1)],
        ),
        4,
        4,
    )
    b.add(
        stat(
            "API 5xx share",
            prom("max(polycorn:api_errors_5xx:ratio5m) or vector(0)"),
            unit="percentunit",
            steps=[("green", None), ("red", 0.05)],
        ),
        4,
        4,
    )
    b.add(
        timeseries(
            "Records consumed by kind",
            [
                prom(
                    "sum by (kind) (rate(polycorn_ingest_records_total[$__rate_interval]))",
                    "{{kind}}",
                )
            ],
            "ops",
            stack=True,
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Rows written by table",
            [
                prom(
                    "sum by (table) (rate(polycorn_ingest_rows_written_total[$__rate_interval]))",
                    "{{table}}",
                )
            ],
            "ops",
            stack=True,
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Consumer lag per partition",
            [prom("sum by (partition) (polycorn_ingest_consumer_lag)", "partition {{partition}}")],
            "none",
        ),
        8,
        8,
    )
    b.add(
        timeseries(
            "Batch time and end-to-end lag",
            [
                prom(
                    "histogram_quantile(0.5, sum by (le) (rate(polycorn_ingest_batch_seconds_bucket"
                    "[$__rate_interval])))",
                    "batch p50",
                ),
                prom(
                    "histogram_quantile(0.99, sum by (le) "
                    "(rate(polycorn_ingest_batch_seconds_bucket[$__rate_interval])))",
                    "batch p99",
                    ref="B",
                ),
                prom(
                    "histogram_quantile(0.9, sum by (le) "
                    "(rate(polycorn_ingest_end_to_end_lag_seconds_bucket[$__rate_interval])))",
                    "end-to-end p90",
                    ref="C",
                ),
            ],
            "s",
        ),
        8,
        8,
    )
    b.add(
        timeseries(
            "Errors and dead letters",
            [
                prom(
                    "sum(rate(polycorn_ingest_db_errors_total[$__rate_interval]))",
                    "database errors",
                ),
                prom(
                    "sum(rate(polycorn_ingest_kafka_errors_total[$__rate_interval]))",
                    "Kafka errors",
                    ref="B",
                ),
                prom(
                    "sum by (reason) (rate(polycorn_ingest_dead_letters_total[$__rate_interval]))",
                    "dead letters {{reason}}",
                    ref="C",
                ),
            ],
            "ops",
        ),
        8,
        8,
    )


def _api_panels(b: Board) -> None:
    """The linkdb-api row: requests, responses by status and latency by route."""
    b.row("linkdb-api")
    rate = "rate(polycorn_api_request_duration_seconds_count[$__rate_interval])"
    b.add(
        timeseries(
            "Requests by route",
            [prom(f"sum by (route) ({rate})", "{{route}}")],
            "reqps",
            stack=True,
        ),
        8,
        8,
    )
    b.add(
        timeseries(
            "Responses by status",
            [prom(f"sum by (status) ({rate})", "{{status}}")],
            "reqps",
            stack=True,
        ),
        8,
        8,
    )
    b.add(
        timeseries(
            "Latency by route (p50, p99)",
            [
                prom(
                    "histogram_quantile(0.5, sum by (route, le) "
                    "(rate(polycorn_api_request_duration_seconds_bucket[$__rate_interval])))",
                    "{{route}} p50",
                ),
                prom(
                    "histogram_quantile(0.99, sum by (route, le) "
                    "(rate(polycorn_api_request_duration_seconds_bucket[$__rate_interval])))",
                    "{{route}} p99",
                    ref="B",
                ),
            ],
            "s",
        ),
        8,
        8,
    )


def _pipeline_panels(b: Board) -> None:
    """The telemetry pipeline row: the proxies' production to Kafka and the relays' spools."""
    b.row("Telemetry pipeline (relay spool -> proxy -> Kafka)")
    b.add(
        timeseries(
            "Proxy: telemetry to Kafka",
            [
                prom(
                    "sum(rate(polycorn_proxy_telemetry_produced_total[$__rate_interval]))",
                    "produced",
                ),
                prom(
                    "sum(rate(polycorn_proxy_telemetry_produce_errors_total[$__rate_interval]))",
                    "produce errors",
                    ref="B",
                ),
                prom(
                    "sum(rate(polycorn_proxy_telemetry_dlq_total[$__rate_interval]))",
                    "dead-lettered",
                    ref="C",
                ),
                prom(
                    "sum(rate(polycorn_proxy_telemetry_refused_total[$__rate_interval]))",
                    "refused (too many in flight)",
                    ref="D",
                ),
            ],
            "ops",
        ),
        12,
        8,
    )
    b.add(
        timeseries(
            "Relay spools",
            [
                prom("sum by (train) (polycorn_telemetry_spool_records)", "{{train}} unconfirmed"),
                prom(
                    "sum by (train) "
                    "(increase(polycorn_telemetry_spool_resent_total[$__rate_interval]))",
                    "{{train}} resent",
                    ref="B",
                ),
            ],
            "none",
        ),
        12,
        8,
    )


def services() -> Json:
    b = Board()
    _ingest_panels(b)
    _api_panels(b)
    _pipeline_panels(b)
    return dashboard(
        "polycorn-services",
        "Polycorn / Ingest and API health",
        "The cloud services: ingest (Kafka -> LinkDB), linkdb-api, and the telemetry pipeline "
        "from the relays' spools through the proxies to Kafka.",
        b,
    )


DASHBOARDS = {
    "fleet-overview.json": fleet,
    "train-paths.json": train,
    "handover-failure-map.json": handover_map,
    "trainer-quality.json": trainer,
    "ingest-api-health.json": services,
}


def render() -> dict[str, str]:
    return {name: json.dumps(make(), indent=2) + "\n" for name, make in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="directory to write (default dashboards/)")
    p.add_argument("--check", action="store_true", help="fail if the committed files differ")
    a = p.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = a.out / name
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(
            f"gen_dashboards: stale: {', '.join(stale)}; run make dashboards",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
