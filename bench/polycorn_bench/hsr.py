"""Analyse a raw HSR benchmark run (``make bench-hsr``).

Usage (from the repository root)::

    uv run --project bench --locked python -m polycorn_bench.hsr RUN_DIR \\
        [--out bench/out/hsr.json] [--md bench/out/hsr.md] [--plots docs/img] [--quiet]

Writes the JSON document (see ``README.md`` for its shape), optionally the markdown report and
the PNG plots, and prints a compact table. The document starts with the run's provenance
(:mod:`polycorn_bench.provenance`): the commit ``run.json`` records, looked at again now; into
``bench/out`` only when that is clean (the run's commit, HEAD still there, nothing uncommitted)
or ``POLYCORN_BENCH_ALLOW_DIRTY=1``. Exit status: 0 on success (input problems are skipped,
counted in the output and reported on stderr), 1 when refused, 2 if ``RUN_DIR/run.json`` is
missing or unusable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polycorn_bench import provenance
from polycorn_bench.analysis import analyse
from polycorn_bench.records import read_run
from polycorn_bench.report import markdown, text_table

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "out" / "hsr.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="polycorn_bench.hsr", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, help="raw run directory (with run.json)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output ({DEFAULT_OUT})")
    p.add_argument("--md", type=Path, help="write the markdown report here")
    p.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    args = p.parse_args(argv)

    try:
        run = read_run(args.run_dir)
    except (OSError, ValueError) as e:
        print(f"polycorn_bench.hsr: cannot read run {args.run_dir}: {e}", file=sys.stderr)
        return 2
    prov = provenance.resume(run.meta, args.out, *([args.md] if args.md else []))
    doc = prov.stamp(analyse(run))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown(doc), encoding="utf-8")
    written = []
    if args.plots:
        from polycorn_bench.plots import plot_all  # matplotlib only when asked for

        written = plot_all(doc, args.plots)

    if run.issues.total:
        print(
            f"polycorn_bench.hsr: {run.issues.total} input problem(s) skipped: "
            + ", ".join(f"{k} ×{v}" for k, v in run.issues.counts.items()),
            file=sys.stderr,
        )
        for example in run.issues.examples[:5]:
            print(f"  {example}", file=sys.stderr)
    if not args.quiet:
        print(text_table(doc))
        print(f"wrote {args.out}" + (f", {args.md}" if args.md else ""), end="")
        print(f", {len(written)} plots in {args.plots}" if args.plots else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
