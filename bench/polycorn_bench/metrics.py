"""The relay's and the proxy's Prometheus snapshots (``logs/relay.metrics``,
``logs/proxy.metrics``), taken by ``python -m polycorn_benchrun.hsr`` at the end of each trip.

Text exposition format: ``# HELP``/``# TYPE``/``# EOF`` comments, then one sample a line,
``name{label="value",...} value`` (the braces may be absent or empty), read with
``prometheus_client``'s parser. Counters are
cumulative over the process, which lives for one trip. Only what the analysis needs is kept:
each metric's value summed over its label sets, and the number of lines that did not parse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

#: Counters read by the analysis (``_total`` is the exposition's counter suffix).
REINJECTED = "polycorn_sched_reinjected_bytes"
REDUNDANT = "polycorn_sched_redundant_bytes"
#: Received passenger bytes dropped as duplicates (the copy arrived after another).
DUPLICATE = "polycorn_recv_duplicate_bytes"
CAPTURE_DOWN = "polycorn_capture_down_bytes"
CAPTURE_UP = "polycorn_capture_up_bytes"


@dataclass(frozen=True)
class Metrics:
    """A parsed snapshot: metric name → value summed over its label sets (finite values
    only), and how many non-comment lines could not be read."""

    values: dict[str, float] = field(default_factory=dict)
    bad_lines: int = 0
    first_bad: str | None = None
    # Every sample with its labels: name -> [(labels, value)], for label-aware reads.
    series: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def labelled(self, name: str, **labels: str) -> float | None:
        """The sum of ``name``'s samples whose labels include ``labels``; None when none."""
        hits = [
            v
            for lab, v in self.series.get(name, [])
            if all(lab.get(k) == want for k, want in labels.items())
        ]
        return sum(hits) if hits else None

    def counter(self, name: str) -> float | None:
        """A counter's value, summed over labels; ``name`` with or without ``_total``.
        None when the snapshot does not have it."""
        base = name.removesuffix("_total")
        for key in (base + "_total", base):
            if key in self.values:
                return self.values[key]
        return None

    @property
    def empty(self) -> bool:
        return not self.values


#: Memory-budget gauges (``polycorn_mem_budget_bytes{level="high"}`` is ``--mem-budget``).
BUDGET_PEAK = "polycorn_mem_budget_peak_bytes"
BUDGET_LEVELS = "polycorn_mem_budget_bytes"


def parse_metrics(text: str) -> Metrics:
    """Parse a snapshot line by line with ``prometheus_client``'s parser (each sample line is
    a complete exposition of one untyped sample), so that one malformed line is counted and
    skipped instead of losing the snapshot; NaN and infinite values count as malformed."""
    values: dict[str, float] = {}
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    bad = 0
    first_bad: str | None = None
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples = [s for fam in text_string_to_metric_families(line) for s in fam.samples]
        except ValueError:
            samples = []
        if len(samples) != 1 or not math.isfinite(samples[0].value):
            bad += 1
            if first_bad is None:
                first_bad = f"line {i}: {line[:80]!r}"
            continue
        sample = samples[0]
        values[sample.name] = values.get(sample.name, 0.0) + sample.value
        series.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return Metrics(values, bad, first_bad, series)


def read_metrics(path: Path) -> Metrics | None:
    """The snapshot at ``path``; None if the file is missing or unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse_metrics(text)
