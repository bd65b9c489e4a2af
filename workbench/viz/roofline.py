"""The roofline: what a chip can sustain at each arithmetic intensity, and where ops or
strategies sit on it.

``roofline(hardware, points)`` draws, on log-log axes, each chip's compute roof (its peak
FLOP/s in ``dtype``) and bandwidth slope (intensity x bytes/s: HBM for ops, or the first
level's link for a strategy's FLOPs per byte communicated), a dashed line at each ridge
(the critical intensity, where the two meet), and each point at its intensity on the first
chip's roof. Drawing only: every number is the `Hardware` spec's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from workbench.core.errors import InputError, given
from workbench.core.hardware import Hardware, resolve
from workbench.viz.style import PALETTE

BANDWIDTHS = ("hbm", "link")
FONT = dict(family="Helvetica, Arial, sans-serif", size=12)


def bandwidth_of(hardware: Hardware, bandwidth: str) -> float:
    """Bytes/s of the slope: "hbm" (memory, for ops) or "link" (the first level's link,
    for collectives inside a node)."""
    if bandwidth not in BANDWIDTHS:
        raise InputError(
            f"bandwidth={given(bandwidth)} is not a slope of the roofline; give 'hbm' (bytes "
            "an op reads and writes) or 'link' (bytes a device sends inside its node)."
        )
    return hardware.hbm_bandwidth if bandwidth == "hbm" else hardware.links[0].bandwidth


def ridge(hardware, dtype="bfloat16", bandwidth: str = "hbm") -> float:
    """The critical intensity in FLOPs per byte: peak FLOP/s over the slope's bytes/s."""
    hw = resolve(hardware)
    return hw.peak_flops(dtype) / bandwidth_of(hw, bandwidth)


def attainable(hardware, intensity: float, dtype="bfloat16", bandwidth: str = "hbm") -> float:
    """FLOP/s an op of ``intensity`` FLOPs per byte can sustain: min(peak, intensity x bw)."""
    hw = resolve(hardware)
    return min(hw.peak_flops(dtype), intensity * bandwidth_of(hw, bandwidth))


def roofline(
    hardware,
    points: Mapping[str, float] | None = None,
    *,
    dtype="bfloat16",
    bandwidth: str = "hbm",
    title: str | None = None,
) -> go.Figure:
    """The roofline of one chip or several (a `Hardware`, a preset's name, or a sequence of
    them), with ``points`` (name -> FLOPs per byte) placed on the first chip's roof."""
    chips = _chips(hardware)
    points = _points(points)
    bandwidth_of(chips[0], bandwidth)  # a clear error for an unknown slope
    slope = "HBM" if bandwidth == "hbm" else chips[0].links[0].name
    lows = [ridge(h, dtype, bandwidth) for h in chips] + list(points.values())
    lo, hi = min(lows) / 8, max(lows) * 8
    fig = go.Figure()
    for i, h in enumerate(chips):
        peak, knee = h.peak_flops(dtype), ridge(h, dtype, bandwidth)
        color = PALETTE[i % len(PALETTE)]
        xs = [lo, knee, hi]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[attainable(h, x, dtype, bandwidth) for x in xs],
                mode="lines",
                name=f"{h.name}: ridge {knee:.0f} FLOP/B",
                line=dict(color=color, width=2),
                hovertemplate="%{x:.3g} FLOP/B: %{y:.3s}FLOP/s<extra>" + h.name + "</extra>",
            )
        )
        fig.add_vline(x=knee, line=dict(color=color, dash="dash", width=1))
        fig.add_annotation(
            x=math.log10(knee), y=math.log10(peak), text=f"{knee:.0f}", showarrow=False,
            yshift=10, font=dict(color=color),
        )  # fmt: skip
    if points:
        h = chips[0]
        fig.add_trace(
            go.Scatter(
                x=list(points.values()),
                y=[attainable(h, x, dtype, bandwidth) for x in points.values()],
                mode="markers",
                name=f"placed on {h.name}",
                text=list(points),
                marker=dict(color="black", size=8, symbol="circle-open"),
                hovertemplate="%{text}<br>%{x:.3g} FLOP/B: %{y:.3s}FLOP/s<extra></extra>",
            )
        )
    fig.update_layout(
        title=title or f"Roofline in {_dtype_name(dtype)}: compute roof and {slope} slope",
        xaxis=dict(type="log", title=f"arithmetic intensity (FLOPs per byte of {slope})"),
        yaxis=dict(type="log", title="attainable FLOP/s", tickformat="~s"),
        font=FONT,
        height=380,
        legend=dict(orientation="h", y=-0.25),
        margin=dict(l=60, r=20, t=50, b=40),
    )
    return fig


def _chips(hardware) -> list[Hardware]:
    if isinstance(hardware, Hardware | str) or hardware is None:
        return [resolve(hardware)]
    if isinstance(hardware, Sequence) and hardware:
        return [resolve(h) for h in hardware]
    raise InputError(
        f"hardware={given(hardware)} is not a chip to draw; give a Hardware, a preset's name "
        "('h100'), or a non-empty list of them."
    )


def _points(points) -> dict[str, float]:
    if points is None:
        return {}
    if not isinstance(points, Mapping):
        raise InputError(
            f"points={given(points)} should map a name to its intensity in FLOPs per byte, "
            "e.g. {'matmul B=256': 240.0}."
        )
    out = {}
    for name, x in points.items():
        if isinstance(x, bool) or not isinstance(x, int | float) or not (0 < x < math.inf):
            raise InputError(
                f"point {name!r} has intensity {given(x)}; a roofline places positive, finite "
                "FLOPs per byte on its log axis (an op with no FLOPs has no place on it)."
            )
        out[str(name)] = float(x)
    return out


def _dtype_name(dtype) -> str:
    return getattr(dtype, "__name__", None) or str(getattr(dtype, "name", dtype))


__all__ = ["BANDWIDTHS", "attainable", "bandwidth_of", "ridge", "roofline"]
