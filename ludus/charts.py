"""Small, dependency-free charts as inline SVG strings (and PNG through matplotlib when asked).

A chart is built once as a `Chart`: a canvas size plus a flat tuple of drawing primitives
(`Line`, `Area`, `Box`, `Dot`, `Label`) in pixel coordinates, y pointing down as in SVG. Two
renderers read the same primitives, so the SVG inlined in a page and the PNG written beside it
show the same picture:

* `Chart.svg()` — a standalone ``<svg>`` element (standard library only): no scripts, no external
  references, hover tooltips through SVG ``<title>`` elements;
* `Chart.png(path)` — matplotlib's Agg canvas, imported only then (no pyplot, no global state).

Builders for the charts a league needs: `line_chart` (series with interval bands), `heatmap`,
`bar_chart` (optionally with interval whiskers) and `lineage_tree` (a genealogy laid out on a time
axis with one lane per branch). The arena's leaderboard page reuses them.

    from ludus.charts import Series, line_chart
    chart = line_chart([Series("main@3", (0, 1, 2), (25, 27, 28), lower=(20, 24, 26), upper=(30, 30, 30))],
                       title="TrueSkill mu", x_label="matches", y_label="mu")
    html = f"<figure>{chart.svg()}</figure>"
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Sequence, Union

# Okabe & Ito's colour-blind-safe palette (2008), then Tableau's extras for longer series lists.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F", "#BCBD22", "#17BECF")
TEXT_COLOR = "#222222"
GRID_COLOR = "#E3E3E3"
AXIS_COLOR = "#888888"
FONT_FAMILY = "DejaVu Sans, Helvetica, Arial, sans-serif"
CHAR_WIDTH = 0.58
"""Average glyph width as a fraction of the font size, for layout (sans-serif, mixed case)."""

Point = tuple[float, float]


def color_of(index: int) -> str:
    """The palette colour of the index-th series (cycles)."""
    return PALETTE[index % len(PALETTE)]


# ---------------------------------------------------------------------------------------------
# Primitives


@dataclass(frozen=True)
class Line:
    """A polyline."""

    points: tuple[Point, ...]
    stroke: str = TEXT_COLOR
    width: float = 1.5
    dash: tuple[float, ...] = ()
    """SVG dash pattern in pixels, e.g. (4, 3); empty for a solid line."""
    opacity: float = 1.0
    tooltip: str = ""


@dataclass(frozen=True)
class Area:
    """A filled polygon (interval bands)."""

    points: tuple[Point, ...]
    fill: str
    opacity: float = 0.2


@dataclass(frozen=True)
class Box:
    """A rectangle (bars, heatmap cells, legend swatches)."""

    x: float
    y: float
    width: float
    height: float
    fill: str
    stroke: str = "none"
    stroke_width: float = 1.0
    radius: float = 0.0
    tooltip: str = ""


@dataclass(frozen=True)
class Dot:
    """A circle (markers, tree nodes)."""

    x: float
    y: float
    r: float
    fill: str
    stroke: str = "none"
    stroke_width: float = 1.0
    tooltip: str = ""


@dataclass(frozen=True)
class Label:
    """A line of text; (x, y) is the anchor point on the text's baseline, or its centre line when
    `middle` is set."""

    x: float
    y: float
    text: str
    size: float = 11.0
    anchor: str = "start"
    """Horizontal alignment: 'start', 'middle' or 'end' (SVG text-anchor)."""
    fill: str = TEXT_COLOR
    bold: bool = False
    rotate: float = 0.0
    """Clockwise rotation in degrees about (x, y)."""
    middle: bool = False
    """Centre the text vertically on y instead of sitting on it."""


Shape = Union[Line, Area, Box, Dot, Label]


@dataclass(frozen=True)
class Chart:
    """A finished chart: canvas size in pixels, its title and the primitives in drawing order."""

    width: int
    height: int
    title: str
    shapes: tuple[Shape, ...] = field(default_factory=tuple)
    kind: str = "chart"
    """What the chart shows ('line', 'heatmap', 'bar', 'tree'); becomes a CSS class of the svg."""

    def svg(self) -> str:
        """The chart as one standalone ``<svg>`` element."""
        return render_svg(self)

    def png(self, path: str, scale: float = 2.0) -> None:
        """Write the chart as a PNG (matplotlib Agg; `scale` pixels per chart pixel)."""
        render_png(self, path, scale)


# ---------------------------------------------------------------------------------------------
# SVG renderer


def _num(value: float) -> str:
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _points(points: Sequence[Point]) -> str:
    return " ".join(f"{_num(x)},{_num(y)}" for x, y in points)


def _tooltip(text: str) -> str:
    return f"<title>{html.escape(text)}</title>" if text else ""


def _shape_svg(shape: Shape) -> str:
    if isinstance(shape, Line):
        dash = f' stroke-dasharray="{" ".join(_num(d) for d in shape.dash)}"' if shape.dash else ""
        opacity = f' stroke-opacity="{_num(shape.opacity)}"' if shape.opacity != 1.0 else ""
        body = _tooltip(shape.tooltip)
        return (f'<polyline points="{_points(shape.points)}" fill="none" stroke="{shape.stroke}" '
                f'stroke-width="{_num(shape.width)}" stroke-linejoin="round" stroke-linecap="round"'
                f'{dash}{opacity}>{body}</polyline>')
    if isinstance(shape, Area):
        return (f'<polygon points="{_points(shape.points)}" fill="{shape.fill}" '
                f'fill-opacity="{_num(shape.opacity)}" stroke="none"/>')
    if isinstance(shape, Box):
        radius = f' rx="{_num(shape.radius)}"' if shape.radius else ""
        stroke = (f' stroke="{shape.stroke}" stroke-width="{_num(shape.stroke_width)}"'
                  if shape.stroke != "none" else "")
        return (f'<rect x="{_num(shape.x)}" y="{_num(shape.y)}" width="{_num(shape.width)}" '
                f'height="{_num(shape.height)}" fill="{shape.fill}"{stroke}{radius}>'
                f'{_tooltip(shape.tooltip)}</rect>')
    if isinstance(shape, Dot):
        stroke = (f' stroke="{shape.stroke}" stroke-width="{_num(shape.stroke_width)}"'
                  if shape.stroke != "none" else "")
        return (f'<circle cx="{_num(shape.x)}" cy="{_num(shape.y)}" r="{_num(shape.r)}" fill="{shape.fill}"'
                f'{stroke}>{_tooltip(shape.tooltip)}</circle>')
    if isinstance(shape, Label):
        weight = ' font-weight="bold"' if shape.bold else ""
        rotate = (f' transform="rotate({_num(shape.rotate)} {_num(shape.x)} {_num(shape.y)})"'
                  if shape.rotate else "")
        baseline = ' dominant-baseline="central"' if shape.middle else ""
        return (f'<text x="{_num(shape.x)}" y="{_num(shape.y)}" font-size="{_num(shape.size)}" '
                f'text-anchor="{shape.anchor}" fill="{shape.fill}"{weight}{baseline}{rotate}>'
                f'{html.escape(shape.text)}</text>')
    raise TypeError(f"not a chart shape: {shape!r}")


def render_svg(chart: Chart) -> str:
    """``<svg>`` markup of a chart: sized in pixels, scalable (viewBox), labelled for screen readers."""
    title = html.escape(chart.title)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="ludus-chart ludus-{chart.kind}" '
             f'width="{chart.width}" height="{chart.height}" viewBox="0 0 {chart.width} {chart.height}" '
             f'role="img" aria-label="{title}" font-family="{FONT_FAMILY}">',
             f"<title>{title}</title>",
             f'<rect x="0" y="0" width="{chart.width}" height="{chart.height}" fill="#ffffff"/>']
    parts.extend(_shape_svg(shape) for shape in chart.shapes)
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# PNG renderer (matplotlib, imported here only)


def render_png(chart: Chart, path: str, scale: float = 2.0) -> None:
    """Draw the chart's primitives with matplotlib's Agg canvas and save a PNG.

    Chart pixels map to points at 72 dpi times `scale`, so sizes (font size, line width) given
    in pixels for the SVG come out the same size relative to the canvas.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle, FancyBboxPatch, Polygon, Rectangle

    # DejaVu Sans ships with matplotlib, so text needs no system fonts.
    dpi = 72.0 * scale
    figure = Figure(figsize=(chart.width / 72.0, chart.height / 72.0), dpi=dpi, facecolor="white")
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, chart.width)
    axes.set_ylim(chart.height, 0)
    axes.set_axis_off()
    for z, shape in enumerate(chart.shapes):
        if isinstance(shape, Line):
            xs, ys = zip(*shape.points) if shape.points else ((), ())
            line = axes.plot(xs, ys, color=shape.stroke, linewidth=shape.width, alpha=shape.opacity,
                             solid_capstyle="round", solid_joinstyle="round", zorder=z)[0]
            if shape.dash:
                line.set_dashes([d / shape.width for d in shape.dash])
        elif isinstance(shape, Area):
            axes.add_patch(Polygon(shape.points, closed=True, facecolor=shape.fill, alpha=shape.opacity,
                                   edgecolor="none", zorder=z))
        elif isinstance(shape, Box):
            edge = None if shape.stroke == "none" else shape.stroke
            width = shape.stroke_width if edge else 0.0
            if shape.radius:
                patch = FancyBboxPatch((shape.x, shape.y), shape.width, shape.height,
                                       boxstyle=f"round,pad=0,rounding_size={shape.radius}",
                                       facecolor=shape.fill, edgecolor=edge or "none", linewidth=width, zorder=z)
            else:
                patch = Rectangle((shape.x, shape.y), shape.width, shape.height, facecolor=shape.fill,
                                  edgecolor=edge or "none", linewidth=width, zorder=z)
            axes.add_patch(patch)
        elif isinstance(shape, Dot):
            edge = None if shape.stroke == "none" else shape.stroke
            axes.add_patch(Circle((shape.x, shape.y), shape.r, facecolor=shape.fill, edgecolor=edge or "none",
                                  linewidth=shape.stroke_width if edge else 0.0, zorder=z))
        elif isinstance(shape, Label):
            axes.text(shape.x, shape.y, shape.text, fontsize=shape.size, color=shape.fill,
                      fontweight="bold" if shape.bold else "normal", family="DejaVu Sans",
                      ha={"start": "left", "middle": "center", "end": "right"}[shape.anchor],
                      va="center" if shape.middle else "baseline", rotation=-shape.rotate,
                      rotation_mode="anchor", zorder=z)
        else:
            raise TypeError(f"not a chart shape: {shape!r}")
    figure.savefig(path, dpi=dpi, facecolor="white")


# ---------------------------------------------------------------------------------------------
# Layout helpers


def text_width(text: str, size: float) -> float:
    """Estimated rendered width of `text` in pixels."""
    return len(text) * size * CHAR_WIDTH


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [low, high] (steps of 1, 2, 2.5 or 5 x 10^k)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"tick range must be finite, got [{low}, {high}]")
    if high < low:
        low, high = high, low
    if high == low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high - step * 1e-9:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def format_tick(value: float) -> str:
    """Compact tick text: 1.5k, 2M, 0.25."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:g}k"
    if magnitude >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.3g}"


def _truncate(text: str, size: float, max_width: float) -> str:
    if text_width(text, size) <= max_width:
        return text
    keep = max(int(max_width / (size * CHAR_WIDTH)) - 1, 1)
    return text[:keep] + "…"


@dataclass(frozen=True)
class _Frame:
    """The plotting rectangle of an x/y chart and its data ranges."""

    left: float
    top: float
    right: float
    bottom: float
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def x(self, value: float) -> float:
        lo, hi = self.x_range
        return self.left + (value - lo) / (hi - lo) * (self.right - self.left)

    def y(self, value: float) -> float:
        lo, hi = self.y_range
        return self.bottom - (value - lo) / (hi - lo) * (self.bottom - self.top)


def _title(width: float, title: str) -> list[Shape]:
    return [Label(12, 20, title, size=13, bold=True)] if title else []


def _axes(frame: _Frame, x_ticks: Sequence[float] | None, y_ticks: Sequence[float], x_label: str,
          y_label: str) -> list[Shape]:
    shapes: list[Shape] = []
    for tick in y_ticks:
        y = frame.y(tick)
        shapes.append(Line(((frame.left, y), (frame.right, y)), stroke=GRID_COLOR, width=1))
        shapes.append(Label(frame.left - 6, y, format_tick(tick), size=10, anchor="end", middle=True,
                            fill="#555555"))
    for tick in x_ticks or ():
        x = frame.x(tick)
        shapes.append(Line(((x, frame.bottom), (x, frame.bottom + 4)), stroke=AXIS_COLOR, width=1))
        shapes.append(Label(x, frame.bottom + 16, format_tick(tick), size=10, anchor="middle", fill="#555555"))
    shapes.append(Line(((frame.left, frame.bottom), (frame.right, frame.bottom)), stroke=AXIS_COLOR, width=1))
    shapes.append(Line(((frame.left, frame.top), (frame.left, frame.bottom)), stroke=AXIS_COLOR, width=1))
    if x_label:
        shapes.append(Label((frame.left + frame.right) / 2, frame.bottom + 32, x_label, size=11, anchor="middle"))
    if y_label:
        shapes.append(Label(14, (frame.top + frame.bottom) / 2, y_label, size=11, anchor="middle", rotate=-90,
                            middle=True))
    return shapes


def _legend(entries: Sequence[tuple[str, str]], x: float, y: float, max_width: float) -> list[Shape]:
    """Swatch + name entries laid out in rows starting at (x, y)."""
    shapes: list[Shape] = []
    cx, cy = x, y
    for name, color in entries:
        width = 16 + text_width(name, 10) + 14
        if cx + width > x + max_width and cx > x:
            cx, cy = x, cy + 16
        shapes.append(Box(cx, cy - 8, 10, 10, color, radius=2))
        shapes.append(Label(cx + 14, cy + 1, name, size=10))
        cx += width
    return shapes


def _legend_rows(entries: Sequence[tuple[str, str]], max_width: float) -> int:
    rows, cx = 1, 0.0
    for name, _ in entries:
        width = 16 + text_width(name, 10) + 14
        if cx + width > max_width and cx > 0:
            rows, cx = rows + 1, 0.0
        cx += width
    return rows


# ---------------------------------------------------------------------------------------------
# Line chart with interval bands


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
    """Draw a dot at every point (with a tooltip of its values)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", tuple(float(v) for v in self.x))
        object.__setattr__(self, "y", tuple(float(v) for v in self.y))
        if len(self.x) != len(self.y):
            raise ValueError(f"series {self.name!r}: {len(self.x)} x values but {len(self.y)} y values")
        for bound in ("lower", "upper"):
            values = getattr(self, bound)
            if values is not None:
                values = tuple(float(v) for v in values)
                object.__setattr__(self, bound, values)
                if len(values) != len(self.x):
                    raise ValueError(f"series {self.name!r}: {bound} has {len(values)} values for {len(self.x)} points")


def line_chart(series: Sequence[Series], title: str = "", x_label: str = "", y_label: str = "",
               width: int = 680, height: int = 340, y_range: tuple[float, float] | None = None,
               x_range: tuple[float, float] | None = None,
               reference: Sequence[tuple[float, str]] = ()) -> Chart:
    """Lines over a shared x axis, each with an optional shaded interval band and a legend.

    Args:
        series: the lines; a series with `lower`/`upper` gets a band between them.
        y_range / x_range: fixed axis ranges; None fits the data (bands included).
        reference: horizontal reference lines (y value, label), drawn dashed.
    """
    entries = [(s.name, s.color or color_of(i)) for i, s in enumerate(series)]
    legend_rows = _legend_rows(entries, width - 80) if len(series) > 1 else 0
    top = 34 + 16 * legend_rows
    frame_left, frame_right, frame_bottom = 62.0, width - 18.0, height - 46.0
    xs = [v for s in series for v in s.x]
    ys = [v for s in series for v in s.y]
    ys += [v for s in series for v in (s.lower or ())] + [v for s in series for v in (s.upper or ())]
    ys += [v for v, _ in reference]
    finite_y = [v for v in ys if math.isfinite(v)]
    if x_range is None:
        x_range = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_range[0] == x_range[1]:
        x_range = (x_range[0] - 1, x_range[1] + 1)
    if y_range is None:
        lo, hi = (min(finite_y), max(finite_y)) if finite_y else (0.0, 1.0)
        y_ticks = nice_ticks(lo, hi)
        y_range = (y_ticks[0], y_ticks[-1])
    else:
        y_ticks = [t for t in nice_ticks(*y_range) if y_range[0] - 1e-9 <= t <= y_range[1] + 1e-9]
    frame = _Frame(frame_left, top, frame_right, frame_bottom, x_range, y_range)
    x_ticks = [t for t in nice_ticks(*x_range, count=6) if x_range[0] - 1e-9 <= t <= x_range[1] + 1e-9]
    shapes: list[Shape] = _title(width, title)
    if legend_rows:
        shapes += _legend(entries, frame_left, 40, width - 80)
    shapes += _axes(frame, x_ticks, y_ticks, x_label, y_label)
    for value, label in reference:
        y = frame.y(value)
        shapes.append(Line(((frame.left, y), (frame.right, y)), stroke="#999999", width=1, dash=(5, 4)))
        shapes.append(Label(frame.right - 4, y - 4, label, size=9, anchor="end", fill="#777777"))
    for s, (_, color) in zip(series, entries):
        if s.lower is not None and s.upper is not None and s.x:
            upper = [(frame.x(x), frame.y(u)) for x, u in zip(s.x, s.upper)]
            lower = [(frame.x(x), frame.y(v)) for x, v in zip(s.x, s.lower)]
            shapes.append(Area(tuple(upper + lower[::-1]), color, opacity=0.15))
    for s, (_, color) in zip(series, entries):
        points = tuple((frame.x(x), frame.y(y)) for x, y in zip(s.x, s.y))
        if len(points) == 1 or s.markers:
            for (px, py), x, y in zip(points, s.x, s.y):
                shapes.append(Dot(px, py, 3, color, tooltip=f"{s.name}: {format_tick(x)}, {y:.4g}"))
        if len(points) > 1:
            shapes.append(Line(points, stroke=color, width=2, dash=(6, 4) if s.dashed else (),
                               tooltip=s.name))
    return Chart(width, height, title, tuple(shapes), kind="line")


# ---------------------------------------------------------------------------------------------
# Heatmap


def _mix(c1: tuple[int, int, int], c2: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    return tuple(round(a + (b - a) * t) for a, b in zip(c1, c2))  # type: ignore[return-value]


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


_RED, _WHITE, _BLUE, _PALE = (202, 0, 32), (247, 247, 247), (5, 113, 176), (240, 246, 252)


def diverging_color(value: float, low: float, high: float) -> str:
    """Red (low) -> near-white (middle) -> blue (high), ColorBrewer RdBu's ends."""
    t = 0.5 if high == low else min(max((value - low) / (high - low), 0.0), 1.0)
    return _hex(_mix(_RED, _WHITE, t * 2) if t < 0.5 else _mix(_WHITE, _BLUE, (t - 0.5) * 2))


def sequential_color(value: float, low: float, high: float) -> str:
    """Pale -> blue."""
    t = 0.0 if high == low else min(max((value - low) / (high - low), 0.0), 1.0)
    return _hex(_mix(_PALE, _BLUE, t))


def _ink_on(fill: str) -> str:
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#ffffff" if 0.299 * r + 0.587 * g + 0.114 * b < 140 else TEXT_COLOR


def heatmap(rows: Sequence[str], columns: Sequence[str], values: Sequence[Sequence[float | None]],
            title: str = "", low: float = 0.0, high: float = 1.0, scale: str = "diverging",
            value_format: str = "{:.2f}", tooltips: Sequence[Sequence[str]] | None = None,
            cell: float | None = None, x_label: str = "", y_label: str = "") -> Chart:
    """A matrix of coloured cells with their values written in (when the cells are big enough).

    Args:
        values: [rows][columns]; None for a missing cell (drawn hatched grey).
        scale: 'diverging' (red-white-blue around the middle of [low, high]) or 'sequential'.
        tooltips: [rows][columns] hover text; default "row vs column: value".
        cell: cell size in pixels; None picks 14-44 px from the matrix size.
    """
    n_rows, n_cols = len(rows), len(columns)
    if len(values) != n_rows or any(len(r) != n_cols for r in values):
        raise ValueError(f"heatmap values must be {n_rows} rows of {n_cols} columns")
    if scale not in ("diverging", "sequential"):
        raise ValueError(f"scale must be 'diverging' or 'sequential', got {scale!r}")
    color = diverging_color if scale == "diverging" else sequential_color
    if cell is None:
        cell = float(min(44, max(14, 560 // max(n_rows, n_cols, 1))))
    row_label_width = min(max((text_width(r, 10) for r in rows), default=0) + 10, 180)
    col_label_height = min(max((text_width(c, 10) for c in columns), default=0) * 0.72 + 12, 140)
    left = row_label_width + (18 if y_label else 6)
    top = 34 + col_label_height
    width = int(left + cell * n_cols + 20)
    legend_y = top + cell * n_rows + 16
    height = int(legend_y + 30 + (18 if x_label else 0))
    width = max(width, 260, int(text_width(title, 13) + 30))
    shapes: list[Shape] = _title(width, title)
    show_values = cell >= 30
    for i, row in enumerate(rows):
        shapes.append(Label(left - 6, top + cell * (i + 0.5), _truncate(row, 10, row_label_width - 8), size=10,
                            anchor="end", middle=True))
    for j, column in enumerate(columns):
        x = left + cell * (j + 0.5)
        shapes.append(Label(x + 3, top - 6, _truncate(column, 10, 180), size=10, anchor="start", rotate=-45))
    for i in range(n_rows):
        for j in range(n_cols):
            value = values[i][j]
            x, y = left + cell * j, top + cell * i
            tip = tooltips[i][j] if tooltips is not None else (
                f"{rows[i]} vs {columns[j]}: " + ("no data" if value is None else value_format.format(value)))
            if value is None or (isinstance(value, float) and math.isnan(value)):
                shapes.append(Box(x, y, cell, cell, "#eeeeee", stroke="#ffffff", tooltip=tip))
                shapes.append(Line(((x + 3, y + cell - 3), (x + cell - 3, y + 3)), stroke="#cccccc", width=1))
                continue
            fill = color(float(value), low, high)
            shapes.append(Box(x, y, cell, cell, fill, stroke="#ffffff", tooltip=tip))
            if show_values:
                shapes.append(Label(x + cell / 2, y + cell / 2, value_format.format(value), size=9,
                                    anchor="middle", middle=True, fill=_ink_on(fill)))
    if x_label:
        shapes.append(Label(left + cell * n_cols / 2, legend_y + 44, x_label, size=11, anchor="middle"))
    if y_label:
        shapes.append(Label(12, top + cell * n_rows / 2, y_label, size=11, anchor="middle", rotate=-90, middle=True))
    # Colour scale: 20 steps from low to high.
    steps, bar_width = 20, min(200.0, width - left - 20)
    for k in range(steps):
        v = low + (high - low) * (k + 0.5) / steps
        shapes.append(Box(left + bar_width * k / steps, legend_y, bar_width / steps + 0.5, 10, color(v, low, high)))
    shapes.append(Label(left, legend_y + 22, value_format.format(low), size=9, anchor="start"))
    shapes.append(Label(left + bar_width, legend_y + 22, value_format.format(high), size=9, anchor="end"))
    return Chart(width, height, title, tuple(shapes), kind="heatmap")


# ---------------------------------------------------------------------------------------------
# Bar chart


def bar_chart(labels: Sequence[str], values: Sequence[float], title: str = "", y_label: str = "",
              intervals: Sequence[tuple[float, float]] | None = None, value_range: tuple[float, float] | None = None,
              colors: Sequence[str] | None = None, reference: float | None = None, value_format: str = "{:.3f}",
              width: int | None = None, height: int = 300) -> Chart:
    """Vertical bars with optional interval whiskers, value labels and a dashed reference level.

    Args:
        intervals: (lower, upper) per bar, drawn as whiskers (e.g. Wilson 95% intervals).
        value_range: fixed y range; None fits [min(0, values), max(values, uppers)].
        reference: y value of a dashed horizontal line (e.g. 0.5 for an even score).
    """
    n = len(labels)
    if len(values) != n or (intervals is not None and len(intervals) != n):
        raise ValueError("bar_chart needs one value (and one interval) per label")
    label_room = min(max((text_width(lab, 10) for lab in labels), default=0) * 0.72 + 14, 130)
    if width is None:
        width = int(max(320, min(960, 90 + 38 * n), text_width(title, 13) + 30))
    frame_bottom = height - label_room - 8
    highs = list(values) + ([u for _, u in intervals] if intervals else [])
    highs += [reference] if reference is not None else []
    lows = list(values) + ([lo for lo, _ in intervals] if intervals else [])
    if value_range is None:
        ticks = nice_ticks(min(0.0, min(lows, default=0.0)), max(highs, default=1.0) or 1.0)
        value_range = (ticks[0], ticks[-1])
    else:
        ticks = [t for t in nice_ticks(*value_range) if value_range[0] - 1e-9 <= t <= value_range[1] + 1e-9]
    frame = _Frame(62.0, 40.0, width - 16.0, frame_bottom, (0.0, float(max(n, 1))), value_range)
    shapes: list[Shape] = _title(width, title)
    shapes += _axes(frame, None, ticks, "", y_label)
    slot = (frame.right - frame.left) / max(n, 1)
    bar = min(slot * 0.7, 48)
    zero = frame.y(min(max(0.0, value_range[0]), value_range[1]))
    for i, (label, value) in enumerate(zip(labels, values)):
        cx = frame.left + slot * (i + 0.5)
        fill = colors[i] if colors is not None else PALETTE[0]
        y = frame.y(value)
        interval_text = ""
        if intervals is not None:
            lo, hi = intervals[i]
            interval_text = f" [{value_format.format(lo)}, {value_format.format(hi)}]"
        shapes.append(Box(cx - bar / 2, min(y, zero), bar, max(abs(zero - y), 0.5), fill,
                          tooltip=f"{label}: {value_format.format(value)}{interval_text}"))
        if intervals is not None:
            y_lo, y_hi = frame.y(intervals[i][0]), frame.y(intervals[i][1])
            shapes.append(Line(((cx, y_lo), (cx, y_hi)), stroke=TEXT_COLOR, width=1.2))
            shapes.append(Line(((cx - 5, y_lo), (cx + 5, y_lo)), stroke=TEXT_COLOR, width=1.2))
            shapes.append(Line(((cx - 5, y_hi), (cx + 5, y_hi)), stroke=TEXT_COLOR, width=1.2))
        if slot >= 34:
            top_y = min(y, frame.y(intervals[i][1]) if intervals is not None else y)
            shapes.append(Label(cx, top_y - 4, value_format.format(value), size=9, anchor="middle", fill="#444444"))
        shapes.append(Label(cx + 3, frame.bottom + 10, _truncate(label, 10, 170), size=10, anchor="end", rotate=-45))
    if reference is not None:
        y = frame.y(reference)
        shapes.append(Line(((frame.left, y), (frame.right, y)), stroke="#999999", width=1, dash=(5, 4)))
    return Chart(width, height, title, tuple(shapes), kind="bar")


# ---------------------------------------------------------------------------------------------
# Lineage (genealogy) tree


@dataclass(frozen=True)
class TreeNode:
    """One member of a genealogy."""

    id: str
    parent: str | None
    """id of the parent node; None (or an id not among the nodes) makes a root."""
    label: str = ""
    """Text next to the node; default the id."""
    group: str = ""
    """Colour group (e.g. the league role); one legend entry per group."""
    time: float | None = None
    """Position on the horizontal axis (e.g. the iteration it was frozen); None for all nodes lays
    the tree out by depth instead."""
    detail: str = ""
    """Extra tooltip text."""


def _lanes(nodes: Sequence[TreeNode]) -> dict[str, int]:
    """Lane (row) per node: a child continues its parent's lane when it is the parent's first
    child, else opens a new lane; roots each open a lane (depth-first, in the given order)."""
    ids = {n.id for n in nodes}
    children: dict[str | None, list[TreeNode]] = {}
    for node in nodes:
        parent = node.parent if node.parent in ids and node.parent != node.id else None
        children.setdefault(parent, []).append(node)
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
        kids = children.get(node.id, [])
        # Push in reverse so the first child is handled first (and keeps the lane).
        for k, child in reversed(list(enumerate(kids))):
            stack.append((child, inherited if k == 0 else None))
    for node in nodes:  # nodes on a parent cycle (malformed input): give each its own lane
        if node.id not in lane_of:
            lane_of[node.id], next_lane = next_lane, next_lane + 1
    return lane_of


def _depths(nodes: Sequence[TreeNode]) -> dict[str, int]:
    parent_of = {n.id: n.parent for n in nodes}
    depth: dict[str, int] = {}
    for node in nodes:
        d, cursor, seen = 0, node.parent, {node.id}
        while cursor in parent_of and cursor not in seen:
            seen.add(cursor)
            d += 1
            cursor = parent_of[cursor]
        depth[node.id] = d
    return depth


def lineage_tree(nodes: Sequence[TreeNode], title: str = "", x_label: str = "", width: int = 760) -> Chart:
    """A genealogy: nodes placed by `time` (or depth) left to right, one lane per branch, edges
    from parent to child, coloured by group, labelled where there is room (tooltips always)."""
    if not nodes:
        return Chart(width, 80, title, tuple(_title(width, title) + [Label(12, 50, "(no members)", size=11)]),
                     kind="tree")
    lanes = _lanes(nodes)
    use_time = all(n.time is not None for n in nodes)
    position = {n.id: float(n.time) for n in nodes} if use_time else {k: float(v) for k, v in _depths(nodes).items()}
    groups = list(dict.fromkeys(n.group for n in nodes))
    group_color = {g: color_of(i) for i, g in enumerate(groups)}
    num_lanes = max(lanes.values()) + 1
    lane_height = 34.0
    legend_rows = _legend_rows([(g or "member", "") for g in groups], width - 80)
    top = 40 + 16 * legend_rows + 14
    height = int(top + lane_height * num_lanes + 40)
    lo, hi = min(position.values()), max(position.values())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    frame = _Frame(40.0, top, width - 110.0, top + lane_height * num_lanes, (lo, hi), (0.0, 1.0))
    shapes: list[Shape] = _title(width, title)
    shapes += _legend([(g or "member", group_color[g]) for g in groups], frame.left, 40, width - 80)
    x_ticks = [t for t in nice_ticks(lo, hi, count=6) if lo - 1e-9 <= t <= hi + 1e-9]
    if use_time:
        x_ticks = [t for t in x_ticks if t == int(t)] or x_ticks
    for tick in x_ticks:
        x = frame.x(tick)
        shapes.append(Line(((x, frame.top - 6), (x, frame.bottom)), stroke=GRID_COLOR, width=1))
        shapes.append(Label(x, frame.bottom + 16, format_tick(tick), size=10, anchor="middle", fill="#555555"))
    shapes.append(Label((frame.left + frame.right) / 2, frame.bottom + 32,
                        x_label or ("generation" if not use_time else ""), size=11, anchor="middle"))

    def at(node_id: str) -> Point:
        return frame.x(position[node_id]), frame.top + lane_height * (lanes[node_id] + 0.5)

    ids = {n.id for n in nodes}
    for node in nodes:
        if node.parent in ids and node.parent != node.id:
            (x1, y1), (x2, y2) = at(node.parent), at(node.id)
            points = ((x1, y1), (x2, y2)) if y1 == y2 else ((x1, y1), (x1, y2), (x2, y2))
            shapes.append(Line(points, stroke="#aaaaaa", width=1.5))
    # Label a node when the next node of its lane is far enough away for the text.
    by_lane: dict[int, list[TreeNode]] = {}
    for node in nodes:
        by_lane.setdefault(lanes[node.id], []).append(node)
    for lane_nodes in by_lane.values():
        lane_nodes.sort(key=lambda n: position[n.id])
        last_label_end = -math.inf
        for k, node in enumerate(lane_nodes):
            x, y = at(node.id)
            color = group_color[node.group]
            tip = node.id + (f" ({node.group})" if node.group else "") + (f"\n{node.detail}" if node.detail else "")
            shapes.append(Dot(x, y, 5.5, color, stroke="#ffffff", stroke_width=1.5, tooltip=tip))
            text = node.label or node.id
            is_last = k == len(lane_nodes) - 1
            w = text_width(text, 9)
            if x - w / 2 > last_label_end + 4 or is_last:
                if is_last and x - w / 2 <= last_label_end + 4:
                    shapes.append(Label(x + 9, y, text, size=9, anchor="start", middle=True, fill="#333333"))
                    last_label_end = x + 9 + w
                else:
                    lx = max(x, w / 2 + 4)  # keep a label of a node at the left edge on the canvas
                    shapes.append(Label(lx, y - 10, text, size=9, anchor="middle", fill="#333333"))
                    last_label_end = lx + w / 2
    return Chart(width, height, title, tuple(shapes), kind="tree")


# The stylesheet shared by Ludus's self-contained pages (run report, arena leaderboard).
PAGE_CSS = """
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; color: #222; margin: 24px auto; max-width: 1100px;
       padding: 0 16px; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 13px; }
figure { margin: 12px 0; } figcaption { color: #555; font-size: 12px; margin-top: 4px; }
.row { display: flex; flex-wrap: wrap; gap: 24px; }
svg.ludus-chart { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f6f6f6; } td.name, th.name { text-align: left; }
.empty { color: #777; font-style: italic; }
"""
