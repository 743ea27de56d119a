"""Dockerfile.python copies every uv workspace member's pyproject.toml before
``uv sync --locked``: with one missing, uv sees another workspace than
uv.lock's and the image build fails (found by the compose test when the
harness joined the workspace). Checked here in seconds instead."""

from __future__ import annotations

import tomllib

from polycorn_harness import ROOT


def test_every_workspace_member_is_in_the_python_image_build() -> None:
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"][
        "members"
    ]
    dockerfile = (ROOT / "Dockerfile.python").read_text()
    missing = [m for m in members if f"COPY {m}/pyproject.toml {m}/" not in dockerfile]
    assert missing == [], f"Dockerfile.python does not copy {missing}"
