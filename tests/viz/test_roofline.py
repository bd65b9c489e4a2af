"""The roofline picture, read back from its figure JSON: each chip's roof and slope meet at
its ridge (peak FLOP/s over bytes/s, from the spec), points sit on the roof, and bad input
gets a clear error."""

import pytest

from workbench.core import hardware as hw
from workbench.core.errors import InputError
from workbench.viz.roofline import attainable, ridge, roofline


def _traces(fig):
    return fig.to_plotly_json()["data"]


def test_ridge_is_peak_over_bandwidth_for_every_preset():
    for h in hw.PRESETS.values():
        assert ridge(h, "float32") == pytest.approx(h.peak_flops("float32") / h.hbm_bandwidth)
    assert ridge("h100", bandwidth="link") == pytest.approx(989.5e12 / 450e9)
    assert ridge(hw.TPU_V5E) == pytest.approx(
        hw.TPU_V5E.flops["bfloat16"] / hw.TPU_V5E.hbm_bandwidth
    )


def test_roof_and_slope_meet_at_the_ridge():
    fig = roofline([hw.H100, hw.TPU_V5E])
    lines = [t for t in _traces(fig) if t["mode"] == "lines"]
    assert len(lines) == 2
    for t, h in zip(lines, [hw.H100, hw.TPU_V5E]):
        lo, knee, _hi = t["x"]
        assert knee == pytest.approx(ridge(h))
        assert t["y"][1] == pytest.approx(h.peak_flops("bfloat16"))  # the roof at the ridge
        assert t["y"][2] == pytest.approx(h.peak_flops("bfloat16"))  # flat beyond it
        assert t["y"][0] == pytest.approx(lo * h.hbm_bandwidth)  # the slope below it
        assert h.name in t["name"]


def test_points_sit_on_the_first_chips_roof():
    points = {"memory-bound": 10.0, "compute-bound": 5000.0}
    fig = roofline(hw.H100, points)
    (marks,) = [t for t in _traces(fig) if t["mode"] == "markers"]
    assert marks["text"] == list(points)
    assert marks["y"][0] == pytest.approx(10.0 * hw.H100.hbm_bandwidth)
    assert marks["y"][1] == pytest.approx(hw.H100.peak_flops("bfloat16"))
    assert attainable(hw.H100, 10.0) < attainable(hw.H100, 5000.0)


def test_link_slope_places_strategies_by_flops_per_byte_sent():
    fig = roofline("h100", {"DP": 1000.0}, bandwidth="link")
    (line,) = [t for t in _traces(fig) if t["mode"] == "lines"]
    assert line["x"][1] == pytest.approx(
        hw.H100.peak_flops("bfloat16") / hw.H100.links[0].bandwidth
    )
    assert "nvlink" in fig.layout.xaxis.title.text


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(hardware="no such chip"), "not a hardware preset"),
        (dict(hardware=[]), "non-empty list"),
        (dict(hardware="h100", points={"x": 0.0}), "positive, finite"),
        (dict(hardware="h100", points=[1.0]), "should map a name"),
        (dict(hardware="h100", bandwidth="pcie"), "not a slope"),
    ],
)
def test_bad_input_says_what_would_work(kwargs, words):
    with pytest.raises(InputError, match=words):
        roofline(**kwargs)
