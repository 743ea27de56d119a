"""Reading the services' ``/metrics``: the Rust services serve OpenMetrics
(ending in ``# EOF``), the Python ones the Prometheus text format; both are
parsed with ``prometheus_client``'s parsers, never with regular expressions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> Iterable[Metric]:
    """The metric families of an exposition in either format."""
    if text.rstrip().endswith("# EOF"):
        fams: Iterable[Metric] = openmetrics_families(text)  # type: ignore[no-untyped-call]
        return fams
    return text_string_to_metric_families(text)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition."""
    return [
        Sample(s.name, dict(s.labels), float(s.value)) for f in families(text) for s in f.samples
    ]


def value(text: str, name: str, /, **labels: str) -> float | None:
    """The sum of the samples named ``name`` (a counter's ``..._total``) whose labels
    include ``labels``; ``None`` when there is none (a missing metric is not 0). A label
    may itself be called ``name`` (the services' per-path metrics have one)."""
    hits = [
        s.value
        for s in samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(hits) if hits else None


def sums(text: str) -> dict[str, float]:
    """Sample name -> the sum over its label sets."""
    out: dict[str, float] = {}
    for s in samples(text):
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def targets_up(doc: Mapping[str, object], jobs: Iterable[str]) -> tuple[bool, str]:
    """Prometheus's ``/api/v1/targets?state=active`` answer ``doc``: does every job of
    ``jobs`` have targets, and is every target up? With a line per job."""
    data = doc.get("data")
    active = data.get("activeTargets", []) if isinstance(data, Mapping) else []
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for t in active:
        seen.setdefault(t["labels"]["job"], []).append(
            (t["health"], t["scrapeUrl"], t.get("lastError", ""))
        )
    want = set(jobs)
    report = "\n".join(f"{job}: {seen.get(job, 'absent')}" for job in sorted(set(seen) | want))
    ok = want <= set(seen) and all(h == "up" for ts in seen.values() for h, _, _ in ts)
    return ok, report
