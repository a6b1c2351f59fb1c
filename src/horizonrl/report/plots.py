"""Line plots as inline SVG text.

We write these ~40 lines of SVG ourselves (a polyline, two axes, min/max labels, a title) instead of
depending on matplotlib or plotly, so that report.html stays one offline file (no CDN script, no
image files) and horizonrl keeps no heavy plotting dependency.

Invariant of `line_plot`: point i is drawn at x = LEFT + (xs[i] - min(xs)) / (max(xs) - min(xs)) *
(width - LEFT - RIGHT), y likewise from the bottom margin up (SVG's y axis points down); a range of
zero width is drawn in the middle of the plot area. The labels print the data's min and max (y to 3
significant digits), so the plot is honest about its scale.
"""

from __future__ import annotations

from html import escape

LEFT, RIGHT, TOP, BOTTOM = 64, 14, 30, 34   # plot-area margins, in pixels


def line_plot(xs: list[float], ys: list[float], title: str, x_label: str = "iteration", width: int = 360,
              height: int = 210) -> str:
    """An `<svg class="plot">` of ys over xs (equal lengths); with no points it says "no data"."""
    if len(xs) != len(ys):
        raise ValueError(f"line_plot: {len(xs)} x values but {len(ys)} y values")
    title = escape(title)
    head = (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{title}</title>'
            f'<text class="title" x="{width / 2:g}" y="18" text-anchor="middle">{title}</text>')
    if not xs:
        return head + (f'<text class="nodata" x="{width / 2:g}" y="{height / 2:g}" text-anchor="middle">'
                       'no data</text></svg>')
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    right, bottom = width - RIGHT, height - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (right - LEFT) if x1 > x0 else (LEFT + right) / 2

    def sy(y: float) -> float:
        return bottom - (y - y0) / (y1 - y0) * (bottom - TOP) if y1 > y0 else (TOP + bottom) / 2

    points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
    return head + (
        f'<path class="axis" d="M{LEFT},{TOP} V{bottom} H{right}"/>'
        f'<text class="label" x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">{y1:.3g}</text>'
        f'<text class="label" x="{LEFT - 4}" y="{bottom}" text-anchor="end">{y0:.3g}</text>'
        f'<text class="label" x="{LEFT}" y="{bottom + 14}" text-anchor="start">{x0:g}</text>'
        f'<text class="label" x="{right}" y="{bottom + 14}" text-anchor="end">{x1:g}</text>'
        f'<text class="label" x="{(LEFT + right) / 2:g}" y="{bottom + 28}" text-anchor="middle">'
        f'{escape(x_label)}</text>'
        f'<polyline class="line" points="{points}"/>'
        f'<circle class="last" cx="{sx(xs[-1]):.1f}" cy="{sy(ys[-1]):.1f}" r="3"/></svg>')
