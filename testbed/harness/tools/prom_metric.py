"""Print the value of one metric from a Prometheus ``/metrics`` endpoint or dump.

    prom_metric.py SOURCE SAMPLE_NAME [--label NAME=VALUE]...

SOURCE is a URL, a file, or ``-`` (standard input). The exposition is parsed
with the harness's reading (``polycorn_harness.metrics``: ``prometheus_client``'s
parsers, the OpenMetrics one when the text ends with ``# EOF``, as the Rust
services serve it). Prints the sum of the samples
named SAMPLE_NAME exactly (a counter's ``..._total``, a gauge's name) whose
labels include every ``--label``, as a number (an integer when it is one).
Exits 1, printing nothing to standard output, when the source cannot be read
or parsed or has no such sample: a missing metric is not 0.
"""

from __future__ import annotations

import argparse
import sys
import urllib.request
from pathlib import Path

from polycorn_harness import metrics
from polycorn_harness.metrics import families

__all__ = ["families", "value"]


def read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=5) as r:  # noqa: S310 (scheme checked)
            return str(r.read().decode())
    return Path(source).read_text()


def value(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The harness's reading (polycorn_harness.metrics.value)."""
    return metrics.value(text, name, **labels)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", help="URL, file or - (stdin)")
    p.add_argument("name", help="sample name, e.g. polycorn_ingest_db_errors_total")
    p.add_argument("--label", action="append", default=[], metavar="NAME=VALUE")
    a = p.parse_args(argv)
    labels = dict(kv.split("=", 1) for kv in a.label)
    try:
        v = value(read(a.source), a.name, labels)
    except (OSError, ValueError) as e:
        print(f"prom_metric: {a.source}: {e}", file=sys.stderr)
        return 1
    if v is None:
        want = f"{a.name} {labels}" if labels else a.name
        print(f"prom_metric: {a.source}: no sample {want}", file=sys.stderr)
        return 1
    print(int(v) if v.is_integer() else v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
