"""Analysis of Polycorn's HSR benchmark (``make bench-hsr``).

Module map, in call order: :mod:`~polycorn_bench.hsr` (command line) →
:mod:`~polycorn_bench.records` (read the run directory, count bad input; metrics snapshots
via :mod:`~polycorn_bench.metrics`) → :mod:`~polycorn_bench.analysis` (summaries, the JSON
document), using :mod:`~polycorn_bench.flows` (per-download numbers), :mod:`~polycorn_bench.oracle`
(best possible completion time from the link files, read by :mod:`~polycorn_bench.links`),
:mod:`~polycorn_bench.hrsch` (the HRSCH issue's sections: ratios against the baselines, ablation,
extra traffic, recovery after failed handovers) and :mod:`~polycorn_bench.stats` (geometric
means, bootstrap, IM delay statistics) → :mod:`~polycorn_bench.report` (markdown, terminal
table) and
:mod:`~polycorn_bench.plots` (PNG). See ``README.md`` beside this file for the method.
"""
