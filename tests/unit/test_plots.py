"""line_plot: the SVG polyline puts every point where the scaling rule says, labels the data's range."""

import re

import pytest

from horizonrl.report.plots import BOTTOM, LEFT, RIGHT, TOP, line_plot


def points(svg: str) -> list[tuple[float, float]]:
    (attr,) = re.findall(r'<polyline class="line" points="([^"]*)"', svg)
    return [tuple(float(v) for v in p.split(",")) for p in attr.split()]


def test_points_are_scaled_into_the_plot_area():
    svg = line_plot([0, 1, 2, 4], [10.0, 0.0, 5.0, 10.0], "return", width=300, height=200)
    assert svg.startswith('<svg class="plot"') and svg.endswith("</svg>")
    right, bottom = 300 - RIGHT, 200 - BOTTOM
    xs = [LEFT + f * (right - LEFT) for f in (0, 0.25, 0.5, 1)]
    ys = [TOP, bottom, (TOP + bottom) / 2, TOP]
    drawn = points(svg)
    assert len(drawn) == 4
    for (x, y), (ex, ey) in zip(drawn, zip(xs, ys)):
        assert x == pytest.approx(ex, abs=0.05) and y == pytest.approx(ey, abs=0.05)
    labels = re.findall(r'<text class="label"[^>]*>([^<]*)</text>', svg)
    assert labels == ["10", "0", "0", "4", "iteration"]          # y max, y min, x min, x max, x label
    assert f'<circle class="last" cx="{right:.1f}" cy="{TOP:.1f}"' in svg


def test_a_single_point_or_a_flat_series_is_drawn_in_the_middle():
    svg = line_plot([3], [0.5], "entropy", width=300, height=200)
    assert points(svg) == [((LEFT + 300 - RIGHT) / 2, (TOP + 200 - BOTTOM) / 2)]
    flat = points(line_plot([1, 2, 3], [7, 7, 7], "kl", width=300, height=200))
    assert len(flat) == 3 and {y for _, y in flat} == {(TOP + 200 - BOTTOM) / 2}


def test_no_points_says_no_data_and_titles_are_escaped():
    svg = line_plot([], [], "loss <critic>")
    assert "no data" in svg and "<polyline" not in svg
    assert "loss &lt;critic&gt;" in svg and "<critic>" not in svg
    with pytest.raises(ValueError, match="2 x values but 1 y values"):
        line_plot([1, 2], [1], "bad")
