"""One colour per mixer, the same in every figure.

A mixer's family (the ``family`` its class declares, harness.layers) fixes the region of hues
it is drawn in: softmax attention in blues, the kernel (linear) maps in warm hues, the decays in
greens, the delta rule in purples. Each built-in mixer of a family takes its own swatch of that
region, in the reading order (reading_order(): the families in FAMILY_SWATCHES's order, each
family's mixers in the order harness.layers defines them), so a family reads as related hues while no two
mixers share a colour. An outside mixer (a dotted model.name; its code is never imported here)
takes the next free swatch of the family its runs declare (summary.family), and a mixer with no
known family a neutral one.

Swatches are keyed by family and order, never by position in a figure: a figure that draws three
mixers paints them as the figure that draws eleven does.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import pandas as pd
from matplotlib.colors import to_rgb

# Per family (in reading order: softmax attention first), its swatches in the order its mixers take them; the last ones are left for outside
# mixers of the family. Chosen apart in CIELAB (tests/test_figure_legibility.py holds them apart).
FAMILY_SWATCHES = {
    "softmax": ("#0072B2", "#56B4E9", "#1B2F6E"),
    "linear": ("#E69F00", "#D55E00", "#8C510A", "#F4A582", "#B2182B", "#FEE08B"),
    "decay": ("#00876C", "#8CC63F", "#00441B"),
    "delta": ("#6A3D9A", "#CC79A7", "#C2A5CF"),
}
NEUTRAL = ("#4D4D4D", "#999999", "#7F7F00", "#000000")  # mixers of no known family, in turn
# Each mixer's marker, by its place in the reading order: a second cue beside colour, and two
# mixers at one point stay told apart where one is drawn hollow over the other.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*")


@functools.cache
def builtin_family(name: str) -> str | None:
    """The family a built-in mixer's class declares; None for a name that is no built-in (a
    dotted path is never imported: drawing a figure runs no outside code)."""
    if "." in name:
        return None
    from harness.layers import registry

    if name not in registry.builtin_names():
        return None
    return registry.resolve(name).family or None


def reading_order() -> tuple[str, ...]:
    """The built-in mixers in reading order: by family (FAMILY_SWATCHES's order, a family it does
    not know after), within a family in the order harness.layers defines them. Derived from the
    registry, so a new built-in takes its place without being listed here."""
    from harness.layers import registry

    families = list(FAMILY_SWATCHES)
    names = registry.definition_order()
    rank = {n: (families.index(f) if (f := builtin_family(n)) in families else len(families), i)
            for i, n in enumerate(names)}
    return tuple(sorted(names, key=rank.__getitem__))


def mixer_colors(names: Iterable[str], declared: Mapping[str, str] | None = None) -> dict[str, tuple]:
    """{name: RGB} for every mixer name in ``names``; ``declared``: the family each outside mixer's
    runs report (summary.family), used where the name is no built-in."""
    declared = dict(declared or {})
    names = sorted(set(pd.Series(list(names)).dropna().astype(str)), key=_reading_rank)
    taken = {family: _builtin_members(family) for family in FAMILY_SWATCHES}
    neutral = iter(NEUTRAL * 4)
    out = {}
    for name in names:
        family = builtin_family(name) or declared.get(name)
        members = taken.get(family)
        if members is not None and name not in members and len(members) < len(FAMILY_SWATCHES[family]):
            members.append(name)  # an outside mixer: the next free swatch of its family
        if members is not None and name in members:
            out[name] = to_rgb(FAMILY_SWATCHES[family][members.index(name)])
        else:
            out[name] = to_rgb(next(neutral))
    return out


def family_of(name: str, declared: Mapping[str, str] | None = None) -> str:
    """A mixer's family: its class's, else what its runs declare, else "other"."""
    return builtin_family(str(name)) or (declared or {}).get(str(name)) or "other"


def mixer_markers(names: Iterable[str]) -> dict[str, str]:
    """{name: marker}: built-ins by their place in the reading order, other names after them in turn."""
    order = reading_order()
    names = sorted(set(pd.Series(list(names)).dropna().astype(str)), key=_reading_rank)
    others = iter(range(len(order), len(order) + len(names)))
    return {n: MARKERS[(order.index(n) if n in order else next(others)) % len(MARKERS)] for n in names}


def _builtin_members(family: str) -> list[str]:
    """The built-in mixers of ``family`` in reading order."""
    return [n for n in reading_order() if builtin_family(n) == family]


def _reading_rank(name: str):
    order = reading_order()
    return (order.index(name), "") if name in order else (len(order), name)
