"""hsr.json names the binaries' default pipeline: the bench's constant and the Rust one agree."""

from __future__ import annotations

import re
from pathlib import Path

from polycorn_bench.hrsch import DEFAULT_SCHEME

REGISTRY = Path(__file__).resolve().parents[2] / "crates/core/src/sched/registry.rs"


def test_default_scheme_is_the_binaries_default() -> None:
    m = re.search(r'pub const DEFAULT_PIPELINE: &str = "([^"]+)";', REGISTRY.read_text())
    assert m, f"no DEFAULT_PIPELINE in {REGISTRY}"
    assert m.group(1) == DEFAULT_SCHEME
