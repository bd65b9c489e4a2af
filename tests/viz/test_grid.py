"""The device grid: which device holds which block, as data, text and a plotly figure."""

import numpy as np
import pytest

import workbench as wb
from workbench.core.layout.sharding import Sharding
from workbench.viz import device_blocks, device_grid, device_grid_text

from .programs import MESH, MLP_ARGS, mlp


def sharding(shape, dims, partial=()):
    return Sharding(tuple(shape), np.dtype("float32"), tuple(map(tuple, dims)), tuple(partial))


def spans(blocks):
    """Blocks as hashable ``((start, stop), ...)`` (slices hash only from Python 3.12)."""
    return {pos: tuple((s.start, s.stop) for s in b) for pos, b in blocks.items()}


def test_one_dim_over_two_axes_is_cut_major_to_minor():
    blocks = device_blocks(sharding((8, 4), [("batch", "model"), ()]), MESH)
    assert len(blocks) == 8
    for (ib, im), (rows, cols) in blocks.items():
        assert rows == slice(ib * 4 + im, ib * 4 + im + 1)
        assert cols == slice(0, 4)


def test_two_dims_over_two_axes():
    blocks = device_blocks(sharding((8, 4), [("batch",), ("model",)]), MESH)
    assert blocks[(1, 2)] == (slice(4, 8), slice(2, 3))
    assert set(spans(blocks).values()) == {
        ((4 * i, 4 * i + 4), (j, j + 1)) for i in range(2) for j in range(4)
    }


def test_minor_then_major_order_matters():
    blocks = device_blocks(sharding((8,), [("model", "batch")]), MESH)
    assert blocks[(1, 0)] == (slice(1, 2),)  # batch is minor: block 0*2 + 1
    assert blocks[(0, 1)] == (slice(2, 3),)


def test_a_3d_value():
    blocks = device_blocks(sharding((4, 6, 16), [("batch",), (), ("model",)]), MESH)
    assert blocks[(1, 3)] == (slice(2, 4), slice(0, 6), slice(12, 16))
    assert len(set(spans(blocks).values())) == 8


def test_axes_not_tiling_replicate_and_partial_changes_no_block():
    tiled = sharding((8, 4), [("batch",), ()])
    partial = sharding((8, 4), [("batch",), ()], [("model", "sum")])
    blocks = device_blocks(partial, MESH)
    assert blocks == device_blocks(tiled, MESH)
    assert blocks[(0, 0)] == blocks[(0, 3)] == (slice(0, 4), slice(0, 4))  # model replicates


def test_blocks_cover_the_array_once_per_replica():
    s = sharding((8, 12), [("model",), ("batch",)])
    counts = np.zeros(s.shape, int)
    for rows, cols in device_blocks(s, MESH).values():
        counts[rows, cols] += 1
    assert (counts == 1).all()


def test_text_table():
    text = device_grid_text(sharding((8, 4), [("batch",), ("model",)]), MESH)
    assert text == "\n".join(
        [
            "f32[8@batch,4@model] on Mesh(batch=2, model=4)",
            "     0:1  1:2  2:3  3:4",
            "0:4  0    1    2    3",
            "4:8  4    5    6    7",
        ]
    )


def test_text_groups_replicas_by_the_minor_replicating_axis():
    mesh = wb.Mesh({"x": 2, "y": 2, "z": 2})
    text = device_grid_text(sharding((4, 4), [("y",), ()]), mesh)
    assert text.splitlines()[2:] == ["0:2  0,1 | 4,5", "2:4  2,3 | 6,7"]
    replicated = device_grid_text(sharding((8,), [()]), MESH)
    assert replicated.splitlines()[-1].strip() == "0-3 | 4-7"


def test_text_says_what_a_partial_sum_means():
    text = device_grid_text(sharding((8, 4), [("batch",), ()], [("model", "sum")]), MESH)
    assert text.splitlines()[0].startswith("f32[8@batch,4]{sum: model}")
    assert "partial term" in text and "sum of the terms over model" in text


def test_figure_has_one_cell_per_block_with_device_labels():
    fig = device_grid(sharding((8, 4), [("batch",), ("model",)]), MESH).to_plotly_json()
    (trace,) = fig["data"]
    assert np.shape(trace["z"]) == (2, 4)
    assert [list(r) for r in trace["text"]] == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    assert list(trace["x"]) == ["0:1", "1:2", "2:3", "3:4"] and list(trace["y"]) == ["0:4", "4:8"]
    assert len({z for row in trace["z"] for z in row}) == 8  # one colour per block
    assert fig["layout"]["title"]["text"] == "f32[8@batch,4@model] on Mesh(batch=2, model=4)"


def test_figure_of_a_replicated_value_is_one_cell():
    fig = device_grid(sharding((8, 4), [(), ()]), MESH).to_plotly_json()
    (trace,) = fig["data"]
    assert [list(r) for r in trace["text"]] == [["0-3 | 4-7"]]


def test_figure_facets_a_3d_value_over_its_leading_blocks():
    fig = device_grid(sharding((4, 6, 16), [("batch",), (), ("model",)]), MESH).to_plotly_json()
    assert len(fig["data"]) == 2
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert titles == ["[0:2, :, :]", "[2:4, :, :]"]
    assert [list(r) for r in fig["data"][1]["text"]] == [["4", "5", "6", "7"]]


def test_figure_stacks_many_leading_blocks_as_rows():
    mesh = wb.Mesh({"a": 4, "b": 8})
    fig = device_grid(sharding((4, 8, 2, 2), [("a",), ("b",), (), ()]), mesh).to_plotly_json()
    (trace,) = fig["data"]
    assert len(trace["y"]) == 32 and trace["y"][0] == "[0:1, 0:1, 0:2, :]"


def test_figure_marks_a_partial_sum():
    fig = device_grid(sharding((8, 4), [("batch",), ()], [("model", "sum")]), MESH)
    title = fig.layout.title.text
    assert "{sum: model}" in title and "partial term" in title


@pytest.mark.parametrize("rank", [0, 1])
def test_low_ranks(rank):
    s = sharding((8,) * rank, [("model",)] * rank)
    (trace,) = device_grid(s, MESH).to_plotly_json()["data"]
    assert np.shape(trace["z"]) == (1, 4 if rank else 1)


def test_from_a_session():
    s = wb.Session(wb.capture(mlp, *MLP_ARGS), MESH).apply(wb.Tile("params/w_in", 1, "model"))
    w = s.sharding("params/w_in")
    assert device_blocks(w, s.mesh)[(1, 3)] == (slice(0, 16), slice(24, 32))
    assert device_grid_text(w, s.mesh).splitlines()[2].split() == [
        "0:16",
        "0,4",
        "1,5",
        "2,6",
        "3,7",
    ]


def test_a_mesh_without_the_axes_is_refused():
    with pytest.raises(wb.WorkbenchError, match="which Mesh\\(data=8\\) does not have"):
        device_blocks(sharding((8,), [("batch",)]), wb.Mesh({"data": 8}))
