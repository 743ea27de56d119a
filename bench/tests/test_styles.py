"""Scheme styles: every catalogued scheme looks different from every other, a scheme's look
does not depend on the run, variants keep their base's colour, and the default stands out."""

from __future__ import annotations

import json
from pathlib import Path

from polycorn_bench.styles import CATALOGUE, label, style

#: The chart's scheduler enum: the built-in compositions, as `polycorn-proxy --list-schedulers`
#: prints them (tools/validate/tests/test_chart.py checks the two are equal).
SCHEMA = Path(__file__).resolve().parents[2] / "charts/polycorn/values.schema.json"


def test_every_catalogued_scheme_has_its_own_colour() -> None:
    colours = [style(s).color for s in CATALOGUE]
    assert len(set(colours)) == len(colours)


def test_variants_keep_the_base_colour_and_differ_otherwise() -> None:
    base, variant = style("hrsch+"), style("hrsch+~cubic")
    assert variant.color == base.color
    assert (variant.marker, variant.hatch) != (base.marker, base.hatch)
    assert style("hrsch@oracle").color == style("hrsch").color


def test_looks_are_stable_and_the_default_stands_out() -> None:
    assert style("some-new-pipeline") == style("some-new-pipeline")
    d = style("hrsch+", "hrsch+")
    assert d.default and d.edgecolor == "black" and d.linewidth > style("hrsch+").linewidth
    assert label("hrsch+", "hrsch+") == "hrsch+ (default)"
    assert label("minrtt", "hrsch+") == "minrtt"


def test_every_builtin_pipeline_has_its_own_look() -> None:
    schema = json.loads(SCHEMA.read_text("utf-8"))
    builtins = schema["definitions"]["scheduler"]["enum"]
    assert builtins, f"no scheduler enum in {SCHEMA}"
    missing = [b for b in builtins if b not in CATALOGUE]
    assert not missing, f"built-in pipelines without a catalogued style: {missing}"
