"""Polycorn trainer: learns where handovers fail (paper §3) from LinkDB and
publishes failure-location tables to the proxies (docs/trainer.md)."""

__version__ = "0.1.0"
