"""Every figure a reader can read: drawn from synthetic results (tests/fixtures/make_results.py),
no text on top of other text, no marker hidden whole under another, and every mixer in a colour
of its own, the same in every figure.

Each figure of analysis.figures.FIGURES is drawn (a new figure module is checked the day it is
registered there), and what is drawn is recorded as it is drawn: every Text artist (titles, axis
labels, tick labels, legend entries, annotations, table cells, heatmap numbers) and every marker
in drawing order, so that only what a reader sees is checked.

Tolerances, in pixels at DPI: two texts may touch by TEXT_TOLERANCE (the padding of a glyph
box); a marker counts as hidden when an opaque filled marker drawn after it covers its whole
disc, or all of it but MARKER_TOLERANCE; a hollow marker hides one of its own shape under it.
Markers are taken as discs of their size, which is what a reader resolves at the figure's scale.
Text at an oblique angle is checked by its upright box, which is larger than its glyphs: the
figures set text horizontal or vertical. See-through dots (each seed's value, drawn to show
through) and error-bar caps are not markers here.
"""
from __future__ import annotations

import copy
import itertools
import pkgutil

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgb, to_rgba
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle
from matplotlib.text import Text

from conftest import make_results

from analysis import figures
from analysis.plots.palette import FAMILY_SWATCHES, mixer_colors, reading_order
from analysis.synthetic.mqar import MQAR_SETTINGS

DPI = 100
TEXT_TOLERANCE = 1.0     # px each box may reach into another
MARKER_TOLERANCE = 1.0   # px of a marker that may show and still count as hidden
MIN_DELTA_E = 20.0       # CIELAB distance (CIE76) between any two mixers' colours
NAMES = [spec.name for spec in figures.FIGURES]
TREES = ("synthetic", "every mixer")
CASES = [(which, name) for which in TREES for name in NAMES]


@pytest.fixture(scope="module")
def drawn_record(tree, tmp_path_factory):
    """{(tree, figure): (the Figure, texts, markers)} as drawn, each list in drawing order; the
    trees are the shared synthetic one and one where every built-in mixer runs in every sweep
    (MQAR at one setting, the quick profile's narrowest figure)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in CROWDED:  # each figure's synthetic runs (analysis.synthetic.<module>.<name>_runs)
            maker = f"analysis.synthetic.{name}.{name}_runs"
            patch.setattr(maker, _crowd(pkgutil.resolve_name(maker)))
        patch.setattr("analysis.synthetic.mqar.MQAR_SETTINGS", MQAR_SETTINGS[:1])  # as the quick profile runs it
        crowded = make_results.write_results_tree(tmp_path_factory.mktemp("every_mixer"))
    out = {}
    for which, root in zip(TREES, (tree, crowded)):
        for spec in figures.FIGURES:
            fig = spec.draw() if spec.experiment is None else spec.draw(figures.load_figure_data(root, spec))
            out[which, spec.name] = None if fig is None else (fig, *record(fig))
    return out


# The sweeps that run mixers (every one but the cost sweep's kernels and the SNR probe's
# feature maps), and each run's fields that hold an accuracy.
CROWDED = ("capacity", "sharpness", "mqar", "induction", "length", "needle", "frontier", "forgetting")
ACCURACY_KEYS = ("accuracy", "val_accuracy", "best_val_accuracy")


def _crowd(maker):
    """``maker`` with a copy of its runs for every built-in mixer it leaves out: taylor (a
    second-order approximation of softmax) just under softmax's runs, as it trains in practice,
    the others elu's runs scaled apart, so the figures are drawn as crowded as a full sweep."""

    def runs(rng):
        payloads = maker(rng)
        ok = [p for p in payloads if p.get("status") == "ok"]
        present = {p["model"] for p in ok}
        missing = [m for m in reading_order() if m not in present]
        for k, model in enumerate(missing):
            source, factor = ("softmax", 0.995) if model == "taylor" else ("elu", 0.97 - 0.06 * k)
            payloads += [_copy_as(p, model, factor) for p in ok if p["model"] == source]
        return payloads

    return runs


def _copy_as(payload, model, factor):
    from harness.layers import registry

    out = copy.deepcopy(payload)
    out["model"], out["config"]["model.name"] = model, model
    out["summary"]["family"] = registry.resolve(model).family
    for rows in [[out["summary"]], *[v for k, v in out.items() if isinstance(v, list) and k != "_metrics"],
                 out.get("_metrics", [])]:
        for row in rows:
            if not isinstance(row, dict):
                continue
            for key in list(row):
                if (key in ACCURACY_KEYS or key.startswith("accuracy/")) and isinstance(row[key], (int, float)):
                    row[key] = min(1.0, row[key] * factor)
    return out


def record(fig):
    """Draw ``fig`` at DPI and return (texts, markers) that were drawn: texts as (artist,
    box in px); markers as (artist, centres in px (n, 2), radii in px, covers)."""
    seen = []
    originals = {cls: cls.draw for cls in (Text, Line2D, PathCollection)}

    def recording(cls):
        def draw(artist, renderer, *args, **kwargs):
            seen.append(artist)
            return originals[cls](artist, renderer, *args, **kwargs)
        return draw

    try:
        for cls in originals:
            cls.draw = recording(cls)
        fig.set_dpi(DPI)
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
    finally:
        for cls, draw in originals.items():
            cls.draw = draw
    renderer = canvas.get_renderer()
    texts, markers = [], []
    for artist in dict.fromkeys(seen):  # once each, where first drawn
        if not artist.get_visible():
            continue
        if isinstance(artist, Text):
            if artist.get_text().strip() and (artist.get_alpha() is None or artist.get_alpha() > 0):
                box = artist.get_window_extent(renderer)
                if box.width > 0 and box.height > 0:
                    texts.append((artist, box))
        else:
            found = _markers(artist, fig)
            if found is not None:
                markers.append((artist, *found))
    return texts, markers


def _markers(artist, fig):
    """(centres px, radii px, covers: opaque and filled) of a marker artist; None for a plain
    line, an error bar's cap or a see-through dot (a seed's value, drawn to show through)."""
    if isinstance(artist, Line2D):
        marker = artist.get_marker()
        if marker in (None, "None", "none", "", " ", ",", "_", "|") or not len(artist.get_xdata()):
            return None
        xy = artist.get_transform().transform(np.column_stack([artist.get_xdata(), artist.get_ydata()]).astype(float))
        radius = np.full(len(xy), artist.get_markersize() * DPI / 72 / 2)
        face = artist.get_markerfacecolor()
        filled = MarkerStyle(marker).is_filled() and artist.get_fillstyle() == "full" and _opaque(face, artist.get_alpha())
        return _inside(xy, radius, artist, filled)
    offsets = artist.get_offsets()
    if not len(offsets) or not len(artist.get_sizes()):
        return None
    alpha = artist.get_alpha()
    if alpha is not None and alpha < 0.9:
        return None
    xy = artist.get_offset_transform().transform(np.asarray(offsets, float))
    radius = np.sqrt(np.resize(artist.get_sizes(), len(xy))) * DPI / 72 / 2
    faces = artist.get_facecolors()
    filled = len(faces) > 0 and all(_opaque(f, alpha) for f in faces)
    return _inside(xy, radius, artist, filled)


def _shape(artist):
    if isinstance(artist, Line2D):
        return artist.get_marker()
    return tuple(map(tuple, np.round(artist.get_paths()[0].vertices, 3))) if artist.get_paths() else None


def _inside(xy, radius, artist, filled):
    keep = np.isfinite(xy).all(axis=1)
    axes = artist.axes
    if axes is not None:  # a marker outside its axes is clipped, not hidden
        box = axes.get_window_extent()
        keep &= (xy[:, 0] >= box.x0 - 1) & (xy[:, 0] <= box.x1 + 1) & (xy[:, 1] >= box.y0 - 1) & (xy[:, 1] <= box.y1 + 1)
    return (xy[keep], radius[keep], filled) if keep.any() else None


def _opaque(color, alpha) -> bool:
    if isinstance(color, str) and color.lower() == "none":
        return False
    rgba = to_rgba(color)
    return (alpha if alpha is not None else rgba[3]) >= 0.9


def overlapping_texts(texts, tolerance=TEXT_TOLERANCE):
    """Pairs of drawn texts whose boxes overlap by more than ``tolerance`` px both ways."""
    found = []
    for (a, box_a), (b, box_b) in itertools.combinations(texts, 2):
        dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if dx > tolerance and dy > tolerance:
            found.append((a.get_text(), b.get_text(), round(dx, 1), round(dy, 1)))
    return found


def hidden_markers(markers, tolerance=MARKER_TOLERANCE):
    """Markers covered whole by an opaque filled marker drawn after them, as (label, x, y)."""
    found = []
    for i, (artist, xy, radius, _filled) in enumerate(markers):
        for other, xy_o, radius_o, filled_o in markers[i + 1:]:
            if other.axes is not artist.axes:
                continue
            # a hollow marker hides only one of its own shape under it (its outline on the other's)
            if not filled_o and _shape(other) != _shape(artist):
                continue
            distance = np.linalg.norm(xy[:, None, :] - xy_o[None, :, :], axis=2)
            covered = (distance + radius[:, None] <= radius_o[None, :] + tolerance).any(axis=1)
            for k in np.flatnonzero(covered):
                found.append((artist.get_label(), "under", other.get_label(), tuple(np.round(xy[k]))))
    return found


@pytest.mark.parametrize("which, name", CASES)
def test_no_text_overlaps_other_text(which, name, drawn_record):
    assert drawn_record[which, name] is not None, f"{name}: no synthetic results draw it (tests/fixtures/make_results.py)"
    _, texts, _ = drawn_record[which, name]
    assert texts, "no text drawn"
    assert overlapping_texts(texts) == []


@pytest.mark.parametrize("which, name", CASES)
def test_no_marker_is_hidden_under_another(which, name, drawn_record):
    assert drawn_record[which, name] is not None, f"{name}: no synthetic results draw it (tests/fixtures/make_results.py)"
    _, _, markers = drawn_record[which, name]
    assert hidden_markers(markers) == []


def test_the_checks_catch_what_they_look_for():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.set_title("a title")
    ax.text(0.5, 1.0, "over the title", transform=ax.transAxes, ha="center", va="bottom")
    ax.plot([1], [1], marker="^", ms=4, ls="", label="small")
    ax.plot([1], [1], marker="o", ms=9, ls="", label="big")
    ax.plot([2], [2], marker="o", ms=6, ls="", label="apart")
    texts, markers = record(fig)
    assert [set(pair[:2]) for pair in overlapping_texts(texts)] == [{"a title", "over the title"}]
    assert [(h[0], h[2]) for h in hidden_markers(markers)] == [("small", "big")]


def _lab(color) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour."""
    rgb = np.asarray(to_rgb(color))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_every_built_in_mixer_has_a_colour_of_its_own_in_its_familys_hues():
    from harness.layers import registry

    names = registry.builtin_names()
    colors = mixer_colors(names)
    pairs = {(a, b): float(np.linalg.norm(_lab(colors[a]) - _lab(colors[b]))) for a, b in itertools.combinations(names, 2)}
    assert min(pairs.values()) >= MIN_DELTA_E, min(pairs, key=pairs.get)
    for name in names:  # its colour is a swatch of the family its class declares
        family = registry.resolve(name).family
        assert colors[name] in [to_rgb(c) for c in FAMILY_SWATCHES[family]], name
    assert set(reading_order()) == set(names)
    # a figure drawing fewer mixers paints them the same
    assert mixer_colors(["mamba", "softmax"]) == {"mamba": colors["mamba"], "softmax": colors["softmax"]}


def test_an_outside_mixer_takes_its_declared_familys_free_swatch_or_a_neutral_one():
    colors = mixer_colors(["softmax", "pkg.Mixer", "pkg.Other"], {"pkg.Mixer": "decay"})
    builtin = set(mixer_colors(reading_order()).values())
    assert colors["pkg.Mixer"] in [to_rgb(c) for c in FAMILY_SWATCHES["decay"]]
    assert colors["pkg.Mixer"] not in builtin and colors["pkg.Other"] not in builtin
    assert colors["pkg.Other"] != colors["pkg.Mixer"]


@pytest.mark.parametrize("which, name", CASES)
def test_each_mixer_keeps_its_colour_across_figures(which, name, drawn_record):
    """A legend entry named by a built-in mixer alone is drawn in that mixer's colour."""
    assert drawn_record[which, name] is not None
    colors = mixer_colors(reading_order())
    fig = drawn_record[which, name][0]
    for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        for text, handle in zip(legend.get_texts(), legend.legend_handles):
            label = text.get_text()
            if label in colors and isinstance(handle, Line2D):
                assert to_rgb(handle.get_color()) == pytest.approx(colors[label], abs=1e-6), (label, handle.get_color())
