"""Polycorn's benchmark and demo orchestrators, one module per ``make`` target:

* :mod:`~polycorn_benchrun.hsr`: ``make bench-hsr`` (and the demo's scheme comparison);
* :mod:`~polycorn_benchrun.loop`: ``make bench-loop``, the closed fleet loop;
* :mod:`~polycorn_benchrun.dataplane`: ``make bench-dataplane``;
* :mod:`~polycorn_benchrun.emu`: ``make bench-emu``, the link emulator's ceiling;
* :mod:`~polycorn_benchrun.api`: ``make bench-api``, the LinkDB API's hot queries;
* :mod:`~polycorn_benchrun.ingest`: ``make bench-ingest``, ingest throughput and lag;
* :mod:`~polycorn_benchrun.matching`: ``make bench-matching``, map matching per fix;
* :mod:`~polycorn_benchrun.trainer_fleet`: ``make bench-trainer``, and the fleet-history
  loader the demo and bench-hsr use;
* :mod:`~polycorn_benchrun.fleet` (with :mod:`~polycorn_benchrun.fleet_traffic`, its
  passengers and origin): ``make bench-fleet``, one cloud node under a fleet's load;
* :mod:`~polycorn_benchrun.demo` and :mod:`~polycorn_benchrun.demo_fleet`: ``make demo``.

Each runs as ``python -m polycorn_benchrun.NAME`` in the root workspace's environment:
the orchestrators drive the services and the harness of that workspace, while the
analysis of what they write (``polycorn_bench``) is bench/'s own uv project, which
they run as a separate command. bench/README.md says why the two are apart.
"""
