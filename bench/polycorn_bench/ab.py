"""Two builds on the same trips: each scheme's bulk goodput in run B over run A.

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.ab RUN_A RUN_B [--out F.json]

RUN_A and RUN_B are raw run directories of ``make bench-hsr`` with the same trips and
load plan, for example ``PROFILE=precision`` run once with the old binaries (``BIN=...``) and
once with the new, both with a fixed ``LOAD_START_S`` so that every download meets the same
links at the same moment in both runs. A change that helps every scheme alike leaves the
ratios to ``minrtt`` where they were; this module compares each scheme with itself instead.

Per link set and scheme: the downloads of B paired with A's by trip and id (both with a
goodput), the geometric mean of goodput_B / goodput_A with a percentile bootstrap interval of
the pairs and one that resamples trips (:func:`polycorn_bench.stats.trip_geomean_ci`), by size
and overall; and each run's geometric mean of oracle time / actual time over the same pairs.
The interval that resamples trips is the one to read: the pairs of one trip share its links.
Two runs of one build on the precision trips differed by an SD of 0.5 % in hsr/minrtt
(docs/results.md); run the same build twice to see this comparison's own floor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from polycorn_bench import provenance
from polycorn_bench.analysis import OVERALL
from polycorn_bench.flows import Flow, collect_flows, paired_ratios_by_trip
from polycorn_bench.records import read_run
from polycorn_bench.stats import bootstrap_geomean_ci, geomean, trip_interval


def _by(flows: list[Flow], scheme: str, label: str | None) -> list[Flow]:
    return [f for f in flows if f.scheme == scheme and (label is None or f.rec.label == label)]


def _oracle(flows: list[Flow], keys: set[tuple[str, int]]) -> float | None:
    v = [r for f in flows if f.pair_key in keys and (r := f.oracle_ratio) is not None and r > 0]
    return geomean(v) if v else None


def compare(a: list[Flow], b: list[Flow], schemes: list[str], labels: list[str]) -> dict[str, Any]:
    """Per scheme and size (and ``overall``): B's goodput over A's, paired by trip and id."""
    out: dict[str, Any] = {}
    for s in schemes:
        per: dict[str, Any] = {}
        for label in [*labels, OVERALL]:
            lab = None if label == OVERALL else label
            fa, fb = _by(a, s, lab), _by(b, s, lab)
            groups = paired_ratios_by_trip(fb, fa)
            ratios = [x for g in groups for x in g]
            if not ratios:
                continue
            lo, hi = bootstrap_geomean_ci(ratios)
            ga = {f.pair_key for f in fa if f.goodput_mbps is not None}
            keys = {f.pair_key for f in fb if f.goodput_mbps is not None} & ga
            per[label] = {
                "n_pairs": len(ratios),
                # Downloads without a goodput (failed) on each side are not in the pairs: a
                # build that fails more downloads must not look better for it.
                "n_failed_a": sum(f.goodput_mbps is None for f in fa),
                "n_failed_b": sum(f.goodput_mbps is None for f in fb),
                "b_over_a": geomean(ratios),
                "ci95": [lo, hi],
                **trip_interval(groups),
                "a_vs_oracle": _oracle(fa, keys),
                "b_vs_oracle": _oracle(fb, keys),
            }
        if per:
            out[s] = per
    return out


def run_ab(root_a: Path, root_b: Path) -> dict[str, Any]:
    ra, rb = read_run(root_a), read_run(root_b)
    same = ("profile", "load_seed", "load_start_s", "bulk")
    differ = [k for k in same if ra.meta.get(k) != rb.meta.get(k)]
    auto = [k for k in ("load_start_s",) if ra.meta.get(k) in (None, "auto")]
    doc: dict[str, Any] = {
        "a": {
            "run_dir": str(root_a),
            "commit": ra.meta.get("commit"),
            "clean": ra.meta.get("clean") is True,
        },
        "b": {
            "run_dir": str(root_b),
            "commit": rb.meta.get("commit"),
            "clean": rb.meta.get("clean") is True,
        },
        # Pairs are only the same moments of the same links when the load plan and its start
        # are the same and fixed.
        "comparable": not differ and not auto,
        "differ": differ + [f"{k} auto" for k in auto],
        "link_sets": {},
        "method": __doc__,
    }
    sets_b = {ls.name: ls for ls in rb.link_sets}
    for ls_a in ra.link_sets:
        ls_b = sets_b.get(ls_a.name)
        if ls_b is None:
            continue
        common = [t.name for t in ls_a.trips if t.name in {x.name for x in ls_b.trips}]
        fa = [f for f in collect_flows(ls_a, ra) if f.trip in common]
        fb = [f for f in collect_flows(ls_b, rb) if f.trip in common]
        schemes = [s for s in ra.schemes if s in rb.schemes]
        doc["link_sets"][ls_a.name] = {
            "trips": common,
            "bulk": compare(fa, fb, schemes, list(ra.sizes)),
        }
    doc["issues"] = {"a": ra.issues.to_json(), "b": rb.issues.to_json()}
    return doc


def _table(doc: dict[str, Any]) -> str:
    lines = []
    if not doc["comparable"]:
        lines.append(
            f"WARNING: the runs differ in {', '.join(doc['differ'])}: "
            "pairs are not the same moments"
        )
    for name, ls in doc["link_sets"].items():
        lines += [
            f"link set {name}, {len(ls['trips'])} trips: goodput B / A overall "
            "[95 % CI, trips] (× oracle A → B)",
        ]
        for s, per in ls["bulk"].items():
            o = per.get(OVERALL)
            if not o:
                continue
            ci = o.get("ci95_trips") or o["ci95"]
            ora, orb = (
                o[k] if o[k] is not None else float("nan") for k in ("a_vs_oracle", "b_vs_oracle")
            )
            lines.append(
                f"  {s:18s} {o['b_over_a']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] n {o['n_pairs']}"
                f"  ({ora:.2f} → {orb:.2f}; failed {o['n_failed_a']} → {o['n_failed_b']})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn_bench.ab", description=__doc__.splitlines()[0])
    p.add_argument("run_a", type=Path, help="run directory of build A (the reference)")
    p.add_argument("run_b", type=Path, help="run directory of build B")
    p.add_argument("--out", type=Path, help="write the comparison as JSON here")
    a = p.parse_args(argv)
    # The comparison's own code; each build's run records its commit under "a" and "b".
    prov = provenance.start(a.out) if a.out else None
    for r in (a.run_a, a.run_b):
        if not (r / "run.json").is_file():
            print(
                f"polycorn_bench.ab: {r}: no run.json (not a bench-hsr run directory)",
                file=sys.stderr,
            )
            return 2
    doc = run_ab(a.run_a, a.run_b)
    if not any(ls["bulk"] for ls in doc["link_sets"].values()):
        print("polycorn_bench.ab: no downloads paired between the two runs", file=sys.stderr)
        return 2
    if prov:
        a.out.write_text(json.dumps(prov.stamp(doc), indent=1) + "\n", encoding="utf-8")
    print(_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
