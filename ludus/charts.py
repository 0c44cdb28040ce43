"""Charts for the report and leaderboard pages: matplotlib figures, inlined as SVG, saved as PNG.

Each builder returns a `Chart` holding one matplotlib `Figure` (the object-oriented API with
the Agg canvas: no pyplot, no global state). `Chart.svg()` is the figure as one ``<svg>`` element
to inline in a page (no scripts, no external references; deterministic ids and no date, so a page
is reproducible); hover tooltips are SVG ``<title>`` elements attached to the artists they
describe (matplotlib's gid mechanism). `Chart.png(path)` saves the same figure as a PNG.

Builders: `line_chart` (series with interval bands), `heatmap`, `bar_chart` (optionally with
interval whiskers) and `lineage_tree`, a genealogy laid out on a time axis with one lane per
branch: the one layout here that no plotting library does (`_lanes`).

    from ludus.charts import Series, line_chart
    chart = line_chart([Series("main@3", (0, 1, 2), (25, 27, 28), lower=(20, 24, 26), upper=(30, 30, 30))],
                       title="TrueSkill mu", x_label="matches", y_label="mu")
    html = f"<figure>{chart.svg()}</figure>"
"""

from __future__ import annotations

import hashlib
import html
import io
import re
from dataclasses import dataclass, field
from typing import Sequence

import matplotlib
import numpy as np
from matplotlib import cm, colors, patches
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# Okabe & Ito's colour-blind-safe palette (2008), then Tableau's extras for longer series lists.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F", "#BCBD22", "#17BECF")
STYLE = {"font.family": "DejaVu Sans", "font.size": 9.0, "axes.edgecolor": "#888888", "axes.grid": True, "grid.color": "#E3E3E3",
         "axes.axisbelow": True, "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False,
         "legend.fontsize": 8.5, "svg.hashsalt": "ludus", "svg.fonttype": "none", "text.color": "#222222"}
DPI = 72
"""One chart pixel is one point: the SVG's viewBox is the chart's size in pixels."""


def color_of(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def player_colors(players: Sequence[str]) -> dict[str, str]:
    """One colour per player for a whole page, by the players' order there (the palette's order,
    cycling past its end): every chart of the page that shows a player, as a line or a bar, draws
    it in the same colour, so a reader follows one player from chart to chart."""
    return {player: color_of(i) for i, player in enumerate(dict.fromkeys(players))}


@dataclass
class Chart:
    """A finished chart: its figure, size in pixels, title, and hover texts by artist id."""

    figure: Figure
    title: str
    kind: str
    """What it shows ('line', 'heatmap', 'bar', 'tree'); a CSS class of the svg."""
    tooltips: dict[str, str] = field(default_factory=dict)

    width = property(lambda self: round(self.figure.get_figwidth() * DPI), doc="Width in pixels.")
    height = property(lambda self: round(self.figure.get_figheight() * DPI), doc="Height in pixels.")

    def tip(self, artist, name: str, text: str) -> None:
        """Give `artist` a hover text. Its SVG id is prefixed per chart, so that several charts
        inlined in one page never share an id."""
        gid = f"{hashlib.sha256(f'{self.kind}:{self.title}'.encode()).hexdigest()[:8]}-{name}"
        artist.set_gid(gid)
        self.tooltips[gid] = text

    def svg(self) -> str:
        """The chart as one standalone ``<svg>`` element, sized in pixels and scalable."""
        buffer = io.StringIO()
        with matplotlib.rc_context(STYLE):
            self.figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
        text = buffer.getvalue()
        text = text[text.index("<svg"):]  # no XML prolog or doctype inside a page
        root = (f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
                f'class="ludus-chart ludus-{self.kind}" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" role="img" aria-label="{html.escape(self.title)}">'
                f"<title>{html.escape(self.title)}</title>")
        text = root + text[text.index(">") + 1:]
        for gid, tip in self.tooltips.items():
            text = text.replace(f'<g id="{gid}">', f'<g id="{gid}"><title>{html.escape(tip)}</title>', 1)
        return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)

    def png(self, path: str, scale: float = 2.0) -> None:
        with matplotlib.rc_context(STYLE):
            self.figure.savefig(path, dpi=DPI * scale, facecolor="white")


def _figure(width: float, height: float, kind: str, title: str) -> tuple[Chart, list]:
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor="white", layout="constrained")
        FigureCanvasAgg(figure)
        if title:
            figure.suptitle(title, x=0.01, ha="left", fontsize=10.5, fontweight="bold")
        return Chart(figure, title, kind), [figure.add_subplot()]


@dataclass(frozen=True)
class Series:
    """One line of a line chart, optionally with an interval band [lower, upper]."""

    name: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None
    color: str | None = None
    """CSS colour; None takes the palette colour of the series' position."""
    dashed: bool = False
    markers: bool = False
    thin: bool = False
    """A thin, pale line without a legend entry (one of many: every snapshot of a run)."""

    def __post_init__(self) -> None:
        for name in ("x", "y", "lower", "upper"):
            values = getattr(self, name)
            if values is not None:
                object.__setattr__(self, name, tuple(float(v) for v in values))
                if len(getattr(self, name)) != len(self.x):
                    raise ValueError(f"series {self.name!r}: {name} has {len(values)} values for {len(self.x)} points")


def line_chart(series: Sequence[Series], title: str = "", x_label: str = "", y_label: str = "",
               width: int = 680, height: int = 340, y_range: tuple[float, float] | None = None,
               x_range: tuple[float, float] | None = None, reference: Sequence[tuple[float, str]] = ()) -> Chart:
    """Lines over a shared x axis with optional shaded interval bands, a legend and dashed
    horizontal reference lines (y value, label)."""
    chart, (ax,) = _figure(width, height, "line", title)
    with matplotlib.rc_context(STYLE):
        for i, s in enumerate(series):
            color = s.color or color_of(i)
            if s.lower is not None and s.upper is not None:
                band = ax.fill_between(s.x, s.lower, s.upper, color=color, alpha=0.18, linewidth=0, step="post")
                chart.tip(band, f"band-{i}", f"{s.name}: 95% interval")
            line, = ax.step(s.x, s.y, where="post", color=color, linewidth=0.8 if s.thin else 1.6,
                            alpha=0.45 if s.thin else 1.0, label="_nolegend_" if s.thin else s.name,
                            linestyle="--" if s.dashed else "-", marker="o" if s.markers else None, markersize=3.5)
            chart.tip(line, f"series-{i}", f"{s.name}: last {s.y[-1]:.4g}" if s.y else s.name)
        for value, label in reference:
            ax.axhline(value, color="#888888", linestyle=":", linewidth=1)
            ax.annotate(label, (1.0, value), xycoords=("axes fraction", "data"), ha="right", va="bottom", color="#666")
        ax.set(xlabel=x_label, ylabel=y_label, **({"ylim": y_range} if y_range else {}),
               **({"xlim": x_range} if x_range else {}))
        if any(not s.thin for s in series):
            chart.figure.legend(loc="outside right upper")
    return chart


def heatmap(rows: Sequence[str], columns: Sequence[str], values: Sequence[Sequence[float | None]],
            title: str = "", low: float = 0.0, high: float = 1.0, scale: str = "diverging",
            value_format: str = "{:.2f}", tooltips: Sequence[Sequence[str]] | None = None,
            cell: float | None = None, x_label: str = "", y_label: str = "",
            counts: Sequence[Sequence[int]] | None = None, min_count: int = 0) -> Chart:
    """A matrix of coloured cells with their values written in; None marks a missing cell (grey,
    "no data" on hover). `scale`: 'diverging' (red-white-blue) or 'sequential' (white-blue).
    `counts`: how many observations each value rests on, written under it; cells with fewer than
    `min_count` are drawn pale, so 4 games do not look as certain as 400."""
    n_rows, n_cols = len(rows), len(columns)
    if len(values) != n_rows or any(len(r) != n_cols for r in values):
        raise ValueError(f"heatmap needs {n_rows} rows of {n_cols} values")
    cell = cell or max(14.0, min(44.0, 520.0 / max(n_rows, n_cols, 1)))
    label_room = 7.0 * max((len(t) for t in [*rows, *columns]), default=1) + 30
    chart, (ax,) = _figure(label_room + cell * n_cols + 90, label_room + cell * n_rows + 60, "heatmap", title)
    grid = np.array([[np.nan if v is None else float(v) for v in row] for row in values], dtype=float)
    cmap = matplotlib.colormaps["RdBu" if scale == "diverging" else "Blues"].with_extremes(bad="#EEEEEE")
    norm = colors.Normalize(low, high)
    with matplotlib.rc_context(STYLE):
        ax.grid(False)
        ax.xaxis.tick_top()
        ax.tick_params(length=0)
        ax.set_xticks(range(n_cols), labels=columns, rotation=45, ha="left", rotation_mode="anchor")
        ax.set_yticks(range(n_rows), labels=rows)
        ax.set(xlabel=x_label, ylabel=y_label, xlim=(-0.5, n_cols - 0.5), ylim=(n_rows - 0.5, -0.5), aspect="equal")
        for i in range(n_rows):
            for j in range(n_cols):
                value = grid[i, j]
                missing = np.isnan(value)
                # one vector patch per cell, so the whole cell carries its hover text
                few = counts is not None and counts[i][j] < min_count
                cell_patch = ax.add_patch(patches.Rectangle(
                    (j - 0.5, i - 0.5), 1, 1, facecolor=cmap(norm(value)) if not missing else "#EEEEEE",
                    edgecolor="white", linewidth=1.0, hatch="//" if missing else None, alpha=0.35 if few else 1.0))
                chart.tip(cell_patch, f"cell-{i}-{j}", tooltips[i][j] if tooltips else f"{rows[i]} vs {columns[j]}: "
                          + ("no data" if missing else value_format.format(value)))
                if not missing and cell >= 24:
                    dark = not few and (abs(norm(value) - 0.5) > 0.3 if scale == "diverging" else norm(value) > 0.6)
                    text = value_format.format(value)
                    if counts is not None and cell >= 30:
                        text += f"\n({counts[i][j]})"
                    ax.text(j, i, text, ha="center", va="center", fontsize=7.0 if counts is not None else 7.5,
                            color="white" if dark else "#222222", linespacing=1.0)
        image = cm.ScalarMappable(norm=norm, cmap=cmap)
        # fewer than 50 colour steps: matplotlib draws the bar as vectors, not an embedded bitmap
        chart.figure.colorbar(image, ax=ax, shrink=0.6, pad=0.02, boundaries=np.linspace(low, high, 33),
                              ticks=np.linspace(low, high, 5), format=lambda v, _: value_format.format(v))
    return chart


def bar_chart(labels: Sequence[str], values: Sequence[float], title: str = "", y_label: str = "",
              intervals: Sequence[tuple[float, float]] | None = None, value_range: tuple[float, float] | None = None,
              colors: Sequence[str] | None = None, reference: float | None = None, value_format: str = "{:.3f}",
              width: int | None = None, height: int = 300) -> Chart:
    """Vertical bars with optional interval whiskers (e.g. 95% intervals), value labels and a
    dashed reference level."""
    n = len(labels)
    if len(values) != n or (intervals is not None and len(intervals) != n):
        raise ValueError("bar_chart needs one value (and one interval) per label")
    chart, (ax,) = _figure(width or max(300, 70 + 48 * n, 6.5 * len(title)), height, "bar", title)
    with matplotlib.rc_context(STYLE):
        errors = None
        if intervals is not None:
            errors = [[v - lo for v, (lo, _) in zip(values, intervals)], [hi - v for v, (_, hi) in zip(values, intervals)]]
        bars = ax.bar(range(n), values, color=list(colors) if colors else color_of(0), yerr=errors, capsize=3,
                      error_kw={"elinewidth": 1, "ecolor": "#444444"})
        ax.bar_label(bars, labels=[value_format.format(v) for v in values], fontsize=7.5, padding=2)
        for i, bar in enumerate(bars):
            extra = f" [{intervals[i][0]:.4g}, {intervals[i][1]:.4g}]" if intervals is not None else ""
            chart.tip(bar, f"bar-{i}", f"{labels[i]}: {value_format.format(values[i])}{extra}")
        ax.set_xticks(range(n), labels=labels, rotation=35 if n > 3 else 0, ha="right" if n > 3 else "center")
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(y_label)
        if value_range:
            ax.set_ylim(*value_range)
        if reference is not None:
            ax.axhline(reference, color="#888888", linestyle=":", linewidth=1)
    return chart


@dataclass(frozen=True)
class TreeNode:
    """One member of a genealogy."""

    id: str
    parent: str | None
    """id of the parent node; None (or an id not among the nodes) makes a root."""
    label: str = ""
    group: str = ""
    """Colour group (e.g. the league role); one legend entry per group."""
    time: float | None = None
    """Position on the horizontal axis (e.g. the iteration); None for all nodes lays out by depth."""
    detail: str = ""
    """Extra tooltip text."""


def _lanes(nodes: Sequence[TreeNode]) -> dict[str, int]:
    """Lane (row) per node: a child continues its parent's lane when it is the parent's first
    child, else opens a new lane; roots each open a lane (depth-first, in the given order)."""
    ids = {n.id for n in nodes}
    children: dict[str | None, list[TreeNode]] = {}
    for node in nodes:
        children.setdefault(node.parent if node.parent in ids and node.parent != node.id else None, []).append(node)
    lane_of: dict[str, int] = {}
    next_lane = 0
    stack: list[tuple[TreeNode, int | None]] = [(root, None) for root in reversed(children.get(None, []))]
    while stack:
        node, inherited = stack.pop()
        if node.id in lane_of:
            continue
        if inherited is None:
            inherited, next_lane = next_lane, next_lane + 1
        lane_of[node.id] = inherited
        # pushed in reverse so the first child is handled first (and keeps the lane)
        stack.extend((child, inherited if k == 0 else None) for k, child in reversed(list(enumerate(children.get(node.id, [])))))
    for node in nodes:  # nodes on a parent cycle (malformed input): give each its own lane
        if node.id not in lane_of:
            lane_of[node.id], next_lane = next_lane, next_lane + 1
    return lane_of


def _depth(node: TreeNode, parent_of: dict[str, str | None]) -> int:
    depth, cursor, seen = 0, node.parent, {node.id}
    while cursor in parent_of and cursor not in seen:
        seen, depth, cursor = seen | {cursor}, depth + 1, parent_of[cursor]
    return depth


def lineage_tree(nodes: Sequence[TreeNode], title: str = "", x_label: str = "", width: int = 760) -> Chart:
    """A genealogy: nodes placed by `time` (or depth) left to right, one lane per branch, edges from
    parent to child, coloured by group, labelled, with a tooltip per node."""
    lanes = _lanes(nodes)
    chart, (ax,) = _figure(width, 110 + 34 * (max(lanes.values(), default=0) + 1), "tree", title)
    parent_of = {n.id: n.parent for n in nodes}
    use_time = bool(nodes) and all(n.time is not None for n in nodes)
    x = {n.id: float(n.time) if use_time else float(_depth(n, parent_of)) for n in nodes}
    groups = list(dict.fromkeys(n.group for n in nodes))
    with matplotlib.rc_context(STYLE):
        ax.grid(axis="y", visible=False)
        ax.set_yticks([])
        ax.spines["left"].set_visible(False)
        ax.set_xlabel(x_label if use_time else "generation")
        for node in nodes:
            if node.parent in x and node.parent != node.id:
                ax.plot([x[node.parent], x[node.id]], [lanes[node.parent], lanes[node.id]], color="#AAAAAA",
                        linewidth=1.2, zorder=1)
        legend_done: set[str] = set()
        for index, node in enumerate(nodes):
            first_of_group = node.group not in legend_done
            legend_done.add(node.group)
            dot = ax.scatter([x[node.id]], [lanes[node.id]], s=40, zorder=2, color=color_of(groups.index(node.group)),
                             label=(node.group or "member") if first_of_group else None)
            chart.tip(dot, f"node-{index}", node.id + (f": {node.detail}" if node.detail else ""))
            ax.annotate(node.label or node.id, (x[node.id], lanes[node.id]), xytext=(0, 7), textcoords="offset points",
                        ha="center", fontsize=7.5)
        if not nodes:
            ax.text(0.5, 0.5, "(no members)", transform=ax.transAxes, ha="center")
        ax.set_ylim(max(lanes.values(), default=0) + 0.7, -0.7)
        if groups:
            chart.figure.legend(loc="outside right upper")
    return chart
