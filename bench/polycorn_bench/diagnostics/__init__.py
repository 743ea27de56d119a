"""One-off comparisons behind the diagnostic runs kept in bench/out/diagnostics/: each
module reads raw run directories (or the files a diagnostic kept) and prints or writes the
comparison that diagnostic's README quotes. Run from bench/ as
``uv run python -m polycorn_bench.diagnostics.NAME ...`` (each module's docstring has
its arguments).
"""
