"""The namespace suites (root, real processes): fixtures from the harness."""

pytest_plugins = ["polycorn_harness.fixtures"]
