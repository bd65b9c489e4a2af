"""Render the pictures in docs/viz.md into docs/images/.

    .venv/bin/python docs/render_examples.py [graphs charts filmstrip]   (default: all)

Program graphs are SVG from graphviz's ``dot``. Plotly figures (device grids, charts,
the collective table) are SVG through kaleido, which drives a Chrome or Chromium
(``pip install kaleido``; Debian's ``chromium`` will do). Without kaleido they are written as
HTML that loads plotly.js from its CDN, and docs/viz.md's SVG links stay as they were.
Everything is planned from shapes (``abstract=True``): no devices, nothing allocated.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import workbench as wb
from workbench.core import hardware as hw
from workbench.models import build
from workbench.viz import (
    collective_table,
    compare_strategies,
    device_grid,
    estimates_over_schedule,
    filmstrip,
    graph_picture,
    memory_breakdown,
    program_graph,
    replay_frames,
    schedule_estimates,
    schedule_labels,
    time_breakdown,
    to_svg,
)

IMAGES = Path(__file__).parent / "images"
STATIC = importlib.util.find_spec("kaleido") is not None
#: A 6.7 B-parameter LM (bfloat16 with float32 master weights and Adam moments) under scan:
#: big enough that data parallelism alone overflows an 80 GB device.
LM_7B = dict(
    batch=16,
    seq_len=1024,
    d_model=4096,
    n_heads=32,
    d_head=128,
    d_ff=16384,
    vocab=32000,
    n_layers=32,
    dtype="bfloat16",
    master_weights=True,
)
MESH_2X4 = {"batch": 2, "model": 4}


def write_svg(name: str, svg: str) -> None:
    (IMAGES / name).write_text(svg, encoding="utf-8")
    print(IMAGES / name)


def write_figure(name: str, fig, width: int = 900, height: int | None = None) -> None:
    width = fig.layout.width or width
    height = fig.layout.height or height or 480
    if STATIC:
        fig.write_image(IMAGES / f"{name}.svg", width=width, height=height)
        print(IMAGES / f"{name}.svg")
    else:
        fig.write_html(IMAGES / f"{name}.html", include_plotlyjs="cdn", full_html=True)
        print(IMAGES / f"{name}.html", "(no kaleido: HTML instead of SVG)")


def graphs_and_grids() -> None:
    """The tiny LM under BP+MP: its graph collapsed and one layer open; two device grids."""
    ex = build("lm", "tiny", abstract=True)
    program = wb.capture(ex.fn, *ex.args)
    s = wb.Session(program, wb.Mesh(MESH_2X4), [wb.BP("batch"), wb.MP("model")])
    collectives = s.collectives()
    write_svg(
        "lm_tiny_bp_mp_graph.svg",
        to_svg(program_graph(program, s.state, s.mesh, collectives=collectives)),
    )
    layer = program_graph(
        program,
        s.state,
        s.mesh,
        collectives=collectives,
        expand=["layer0"],
        phases=("forward",),
    )
    write_svg("lm_tiny_bp_mp_layer0.svg", to_svg(layer))
    write_figure(
        "grid_2d_w_in", device_grid(s.sharding("params/layers/0/mlp/w_in"), s.mesh), 700, 300
    )
    write_figure("grid_3d_hidden", device_grid(s.sharding("layer0/mlp/hidden"), s.mesh), 700, 400)


def charts() -> None:
    """The 6.7 B LM on H100s: time, memory, strategies side by side, a schedule, collectives."""
    ex = build("lm_scan", "large", abstract=True, **LM_7B)
    program = wb.capture(ex.fn, *ex.args)
    strategies = {
        "BP": ({"batch": 8}, [wb.BP("batch")]),
        "BP+Z3": ({"batch": 8}, [wb.BP("batch"), wb.Z3("batch")]),
        "BP+MP": (MESH_2X4, [wb.BP("batch"), wb.MP("model")]),
        "BP+MP+Z3": (MESH_2X4, [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")]),
    }
    sessions = {
        name: wb.Session(program, wb.Mesh(mesh), tactics)
        for name, (mesh, tactics) in strategies.items()
    }
    estimates = {name: s.estimate(hw.H100) for name, s in sessions.items()}
    write_figure("lm_7b_time_bp_mp", time_breakdown(estimates["BP+MP"]), 800)
    write_figure(
        "lm_7b_time_bp_mp_overlap",
        time_breakdown(sessions["BP+MP"].estimate(hw.H100, overlap="full")),
        800,
    )
    write_figure("lm_7b_memory_bp", memory_breakdown(estimates["BP"]))
    write_figure("lm_7b_memory_bp_mp_z3", memory_breakdown(estimates["BP+MP+Z3"]))
    write_figure("lm_7b_strategies", compare_strategies(estimates), 1000)
    full = sessions["BP+MP+Z3"]
    write_figure(
        "lm_7b_schedule",
        schedule_estimates(estimates_over_schedule(full, hw.H100), schedule_labels(full)),
        900,
    )
    write_figure("lm_7b_collectives", collective_table(full, hardware=hw.H100, top=12), 1100)


def mlp_filmstrip() -> None:
    """A tactic's propagation, event by event: tiling an MLP's first weight on ``model``."""

    def mlp(params, x):
        h = jax.nn.relu(x @ params["w_in"])
        return jnp.tanh(h @ params["w_out"]) + x

    f32 = jnp.float32
    params = {"w_in": jax.ShapeDtypeStruct((16, 64), f32)}
    params["w_out"] = jax.ShapeDtypeStruct((64, 16), f32)
    program = wb.capture(mlp, params, jax.ShapeDtypeStruct((8, 16), f32))
    tactics = [wb.Tile("x", 0, "batch"), wb.Tile("params/w_in", 1, "model")]
    s = wb.Session(program, wb.Mesh(MESH_2X4), tactics)
    pic = graph_picture(
        program, s.state, s.mesh, collectives=s.collectives(), collapse=None, legend=False,
        changed=(),
    )  # fmt: skip
    frames = replay_frames(pic, program, s.events(2), s.mesh)
    title = "Tile(params/w_in, dim 1, model), event by event"
    strip = filmstrip(to_svg(pic.digraph), frames, count=6, columns=3, width=300, title=title)
    write_svg("mlp_tile_model_filmstrip.svg", strip)


PARTS = {"graphs": graphs_and_grids, "charts": charts, "filmstrip": mlp_filmstrip}


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    parts = sys.argv[1:] or list(PARTS)
    for part in parts:
        PARTS[part]()
    if not STATIC and {"graphs", "charts"} & set(parts):
        print("kaleido is not installed: plotly figures were written as HTML, not SVG.")
    total = sum(p.stat().st_size for p in IMAGES.iterdir())
    print(f"{IMAGES}: {total / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
