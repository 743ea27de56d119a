"""One look per scheme, the same in every plot of every run.

Each scheme of the catalogue below has its own colour and marker (and, in bar charts, its
own hatch), chosen so that the schemes people compare most take the most distinct looks:
``minrtt`` black, ``hrsch`` blue, ``hrsch+`` red, ``blest`` green, ``ecf`` orange. A scheme
not in the catalogue (a new pipeline, a ``NAME~cc`` or ``NAME@table`` variant) takes the
colour of its base name with another marker and hatch, or else a look from a stable hash of
its name, so that its look does not depend on which other schemes ran. The default pipeline
is drawn thicker, with a black edge, and labelled "(default)".
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

#: Colours in the order the catalogue takes them (matplotlib's tab20, re-ordered so that
#: neighbours differ in hue and lightness, then a few darker tones).
PALETTE = (
    "#000000",  # black
    "#1f77b4",  # blue
    "#d62728",  # red
    "#2ca02c",  # green
    "#ff7f0e",  # orange
    "#9467bd",  # purple
    "#8c564b",  # brown
    "#e377c2",  # pink
    "#17becf",  # cyan
    "#bcbd22",  # olive
    "#7f7f7f",  # grey
    "#aec7e8",  # light blue
    "#ff9896",  # light red
    "#98df8a",  # light green
    "#ffbb78",  # light orange
    "#c5b0d5",  # light purple
    "#c49c94",  # light brown
    "#f7b6d2",  # light pink
    "#9edae5",  # light cyan
    "#dbdb8d",  # light olive
    "#393b79",  # dark blue
    "#637939",  # dark green
    "#843c39",  # dark red
    "#7b4173",  # dark purple
    "#8c6d31",  # dark olive
    "#c7c7c7",  # light grey
    "#e7ba52",  # gold
    "#6b6ecf",  # periwinkle
    "#b5cf6b",  # lime
    "#ce6dbd",  # orchid
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
HATCHES = ("", "//", "..", "xx", "\\\\", "--", "oo", "++")

#: Every scheme bench-hsr runs (polycorn_benchrun.hsr, the full profile, and the variants of
#: testbed/pipelines.toml that runs report), each with its index into the tables above.
CATALOGUE: dict[str, int] = {
    name: i
    for i, name in enumerate(
        (
            "minrtt",
            "hrsch",
            "hrsch+",
            "blest",
            "ecf",
            "redundant",
            "kernel-mptcp-conn",
            "minrtt+hpr",
            "minrtt+tpr",
            "minrtt+ori",
            "roundrobin",
            "minrtt+er",
            "hrsch+stale",
            "hrsch+hol",
            "minrtt+stale",
            "minrtt+hol",
            "single-path-c0",
            "single-path-c1",
            "hrsch+lead100",
            "minrtt+opp",
            "hrsch-k1",
            "hrsch-k2",
            "minrtt+pen",
            "hrsch@mean",
            "hrsch@early",
            "single-path",
            "kernel-mptcp",
        )
    )
}


@dataclass(frozen=True)
class Style:
    """How one scheme is drawn."""

    color: str
    marker: str
    hatch: str
    default: bool

    @property
    def linewidth(self) -> float:
        return 2.6 if self.default else 1.3

    @property
    def edgecolor(self) -> str:
        return "black" if self.default else "none"

    @property
    def zorder(self) -> int:
        return 3 if self.default else 2


def _base(scheme: str) -> str:
    """A variant's base scheme: ``hrsch+~cubic`` and ``hrsch@oracle`` are ``hrsch``-like."""
    return scheme.split("@", 1)[0].split("~", 1)[0]


def style(scheme: str, default_scheme: str | None = None) -> Style:
    """The scheme's look; ``default_scheme`` (the run's default pipeline) is highlighted."""
    default = scheme == default_scheme
    if scheme in CATALOGUE:
        i = CATALOGUE[scheme]
        return Style(
            PALETTE[i % len(PALETTE)],
            MARKERS[i % len(MARKERS)],
            HATCHES[i // len(PALETTE)],
            default,
        )
    h = zlib.crc32(scheme.encode())
    base = _base(scheme)
    if base != scheme and base in CATALOGUE:
        # The base's colour, told apart by marker and hatch.
        color = PALETTE[CATALOGUE[base] % len(PALETTE)]
        return Style(
            color, MARKERS[(h >> 8) % len(MARKERS)], HATCHES[1 + h % (len(HATCHES) - 1)], default
        )
    return Style(
        PALETTE[h % len(PALETTE)],
        MARKERS[(h >> 8) % len(MARKERS)],
        HATCHES[(h >> 16) % len(HATCHES)],
        default,
    )


def label(scheme: str, default_scheme: str | None = None) -> str:
    return f"{scheme} (default)" if scheme == default_scheme else scheme
