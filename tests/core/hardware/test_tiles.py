"""A matmul's shape on a chip's tiles (``hardware/tiles.py``): dims padded to the tiles,
the last wave of tiles over a GPU's SMs part idle, the least wasteful tile chosen; the
dot's record gives its (batch, rows, columns, contraction); the estimate prices it."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from workbench.core import hardware as hw
from workbench.core.hardware.levels import HardwareError
from workbench.core.hardware.tiles import Tiles
from workbench.core.ops.costs import op_cost
from workbench.core.ops.mapping import TensorType


def test_a_dim_short_of_its_tile_is_padded():
    tiles = Tiles(((8, 128, 128),))
    assert tiles.share((1, 1024, 1024, 1024)) == 1.0
    assert tiles.share((1, 1024, 1024, 64)) == pytest.approx(0.5)  # a contraction of 64
    assert tiles.share((1, 1024, 192, 1024)) == pytest.approx(192 / 256)
    assert tiles.share((1, 4, 1024, 1024)) == pytest.approx(0.5)  # 4 of 8 rows
    assert tiles.share(None) == 1.0  # a shape not known


def test_the_last_wave_over_the_units_is_part_idle_and_the_best_tile_is_taken():
    one = Tiles(((128, 128, 1),), units=132)
    # 133 tiles: two waves, the second of one tile
    assert one.share((133, 128, 128, 512)) == pytest.approx(133 / 264)
    assert one.share((264, 128, 128, 512)) == 1.0
    # less than a wave: smaller tiles or a split contraction fill the SMs
    assert one.share((1, 64, 64, 4096)) == 1.0
    # of two tiles the one wasting least: a 3072 x 1536 result is 288 tiles of 128 x 128
    # (3 waves, 396 slots) or 144 of 256 x 128 (2 waves, 264 slots)
    big = Tiles(((256, 128, 1),), units=132)
    assert big.share((1, 3072, 1536, 512)) == pytest.approx(144 / 264)
    two = Tiles(((128, 128, 1), (256, 128, 1)), units=132)
    assert two.share((1, 3072, 1536, 512)) == pytest.approx(288 / 396)


@pytest.mark.parametrize(
    ("shapes", "units"), [((), 0), (((128, 0, 1),), 0), (((128, 128),), 0), (((8, 128, 128),), -1)]
)
def test_bad_tiles_are_refused_saying_what_would_work(shapes, units):
    with pytest.raises(HardwareError, match=r"Tiles\(\(\(128, 128, 1\),\), units=132\)"):
        Tiles(shapes, units)


def test_the_presets_tiles_are_figures_with_sources():
    for h in (hw.A100, hw.H100, hw.H200, hw.TPU_V4, hw.TPU_V5E, hw.TPU_V5P):
        keys = [k for k in h.figures() if k.startswith("matmul_tiles.")]
        assert keys and all(h.sources[k] for k in keys)
    assert hw.H100.figures()["matmul_tiles.units"] == 132
    assert hw.A100.figures()["matmul_tiles.units"] == 108
    assert hw.CPU.matmul_tiles is None


def test_a_dot_records_its_batch_rows_columns_and_contraction():
    # [b, k, m] x [n, b, k] -> [b, m, n]: the rhs's batch dim is not its first
    params = {"dimension_numbers": (((1,), (2,)), ((0,), (1,))), "precision": None,
              "preferred_element_type": None}  # fmt: skip
    f32 = jnp.dtype("float32")
    operands = [TensorType((4, 64, 96), f32), TensorType((48, 4, 64), f32)]
    cost = op_cost("dot_general", params, operands, [TensorType((4, 96, 48), f32)])
    assert cost.gemm == (4, 96, 48, 64)
    assert cost.flops == 2 * 4 * 96 * 48 * 64


def test_a_contraction_short_of_the_tpus_steps_runs_at_its_share():
    # a contraction of 320 fills 2.5 of the MXU's steps of 128: 3 are computed (a 5/6
    # share); the matmul is compute-bound on a v5e (8192 x 8192 x 320 at 197 TFLOP/s is
    # longer than its 145 MB at 819 GB/s)
    def step(x, w):
        return (x @ w).sum()

    x = jax.ShapeDtypeStruct((8192, 320), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((320, 8192), jnp.bfloat16)
    program = wb.capture(step, x, w)
    s = wb.Session(program, wb.Mesh({"data": 8}))
    flat = dataclasses.replace(hw.TPU_V5E, matmul_tiles=None)
    dot = next(o for o in program.body if program.ops[o].primitive == "dot_general")
    tiled = next(o for o in s.estimate(hw.TPU_V5E).ops if o.op == dot)
    untiled = next(o for o in s.estimate(flat).ops if o.op == dot)
    assert tiled.cost.gemm == (1, 8192, 8192, 320)
    assert tiled.seconds == pytest.approx(untiled.seconds * 384 / 320)
