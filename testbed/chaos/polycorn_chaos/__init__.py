"""Polycorn's randomized fault campaign (make chaos; docs/testing.md#fault-campaign)."""
