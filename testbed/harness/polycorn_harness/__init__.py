"""Polycorn's test and benchmark harness.

The integration suites drive real processes in network namespaces. What they
share lives here, so that a suite is a short pytest module:

* :mod:`polycorn_harness.wait`: waiting on a condition with a timeout (never a
  fixed sleep for synchronisation).
* :mod:`polycorn_harness.metrics`: Prometheus and OpenMetrics expositions read
  with ``prometheus_client``'s parsers.
* :mod:`polycorn_harness.topology`: one copy of the emulated HSR topology
  (``testbed/topology.sh``, namespaces, emulator, origin, relay/proxy pair),
  torn down by the ``topologies`` fixture whatever happens, and the check
  that nothing of it is left.
* :mod:`polycorn_harness.fixtures`: the pytest fixtures (release binaries, a
  generated trip, a topology factory, the real servers), a pytest plugin.

docs/testing.md, "The harness", shows how to add a suite.
"""

import os
from pathlib import Path

#: ``make test-deep`` (``POLYCORN_TEST_DEPTH`` above 1): the suites run their
#: full-length trips instead of the shorter ones of ``make test``
#: (docs/testing.md, "make test-deep").
DEEP = int(os.environ.get("POLYCORN_TEST_DEPTH", "1")) > 1

#: The repository root.
ROOT = Path(__file__).resolve().parents[3]
#: The uv workspace's environment, where the Python services' commands are.
VENV = ROOT / ".venv" / "bin"
