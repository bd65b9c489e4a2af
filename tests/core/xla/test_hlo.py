"""Reading collectives out of compiled HLO text (workbench.core.xla.hlo)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from workbench.core.layout.mesh import Mesh
from workbench.core.xla.hlo import HloCollective, bytes_by_kind, normalize_cpu, parse_collectives
from workbench.core.xla.transposes import parse_transposes

AXES = (("batch", 2), ("model", 4))

MODULE = """HloModule m, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%max (x: f32[], y: f32[]) -> f32[] {
  %x.1 = f32[] parameter(0)
  %y.1 = f32[] parameter(1)
  ROOT %m = f32[] maximum(%x.1, %y.1)
}
{extra}
ENTRY %main (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
{body}
}
"""


def hlo(body: str, extra: str = "") -> str:
    return MODULE.replace("{extra}", extra).replace("{body}", body)


def one(body: str, extra: str = "") -> HloCollective:
    (c,) = parse_collectives(hlo(body, extra), AXES)
    return c


def all_reduce(groups: str) -> HloCollective:
    return one(
        f"  ROOT %ar = f32[8,8]{{1,0}} all-reduce(%p), replica_groups={groups}, to_apply=%add"
    )


# ------------------------------------------------------------------ replica_groups syntaxes


@pytest.mark.parametrize(
    ("groups", "expected", "axes"),
    [
        ("{{0,1,2,3},{4,5,6,7}}", ((0, 1, 2, 3), (4, 5, 6, 7)), ("model",)),
        ("{{0,4},{1,5},{2,6},{3,7}}", ((0, 4), (1, 5), (2, 6), (3, 7)), ("batch",)),
        ("{}", (tuple(range(8)),), ("batch", "model")),
        ("{{0,4,1,5,2,6,3,7}}", ((0, 4, 1, 5, 2, 6, 3, 7),), ("model", "batch")),
        ("{{0},{1},{2},{3},{4},{5},{6},{7}}", tuple((i,) for i in range(8)), ()),
        ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7)), ("model",)),
        ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7)), ("batch",)),
        ("[1,8]<=[8]", (tuple(range(8)),), ("batch", "model")),
        ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", ((0, 1, 2, 3), (4, 5, 6, 7)), ("model",)),
        (
            "mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}",
            ((0, 4), (1, 5), (2, 6), (3, 7)),
            ("batch",),
        ),
        (
            "mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}",
            ((0, 1, 2, 3), (4, 5, 6, 7)),
            ("model",),
        ),
        (
            "mesh['axis_0'=4,'axis_1'=2], device_ids=(0,4,1,5,2,6,3,7) {'axis_0'}",
            ((0, 1, 2, 3), (4, 5, 6, 7)),
            ("model",),
        ),
        (
            "mesh['axis_0'=2,'axis_1'=4] {'axis_1','axis_0'}",
            ((0, 4, 1, 5, 2, 6, 3, 7),),
            ("model", "batch"),
        ),
        ("mesh['a'=8] {'a':(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7)), ("batch",)),
        ("mesh['a'=8] {'a':(2)4}", ((0, 1, 2, 3), (4, 5, 6, 7)), ("model",)),
        ("mesh['axis_0'=2,'axis_1'=4] {}", tuple((i,) for i in range(8)), ()),
    ],
)
def test_replica_group_syntaxes(groups, expected, axes):
    c = all_reduce(groups)
    assert c.groups == expected
    assert c.axes == axes


def test_missing_replica_groups_means_all_devices():
    c = one("  ROOT %ar = f32[8,8]{1,0} all-reduce(%p), to_apply=%add")
    assert c.groups == (tuple(range(8)),)
    assert c.axes == ("batch", "model")


@pytest.mark.parametrize("groups", ["{{0,1},{2,3},{4,5},{6,7}}", "{{0,5},{1,4},{2,7},{3,6}}"])
def test_groups_that_are_no_product_of_axes(groups):
    assert all_reduce(groups).axes is None


def test_three_syntaxes_in_one_module():
    body = """  %a = f32[8,8]{1,0} all-reduce(%p), replica_groups={{0,4},{1,5},{2,6},{3,7}}, to_apply=%add
  %b = f32[8,8]{1,0} all-reduce(%a), replica_groups=[2,4]<=[8], to_apply=%max
  ROOT %c = f32[8,8]{1,0} all-reduce(%b), replica_groups=mesh['x'=2,'y'=4] {'x','y'}, to_apply=%add"""
    cs = parse_collectives(hlo(body), AXES)
    assert [(c.name, c.axes, c.reduction) for c in cs] == [
        ("a", ("batch",), "sum"),
        ("b", ("model",), "max"),
        ("c", ("batch", "model"), "sum"),
    ]


# --------------------------------------------------------------------- kinds and records


def test_kinds_shapes_and_bytes_of_each_opcode():
    body = """  %ag = f32[8,32]{1,0} all-gather(%p), replica_groups=[2,4]<=[8], dimensions={1}
  %rs = f32[2,8]{1,0} reduce-scatter(%p), replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
  %a2a = f32[8,8]{1,0} all-to-all(%p), replica_groups=[2,4]<=[8], dimensions={0}
  ROOT %cp = bf16[8,8]{1,0} collective-permute(%p), source_target_pairs={{0,4},{4,0}}"""
    ag, rs, a2a, cp = parse_collectives(hlo(body), AXES)
    assert (ag.kind, ag.bytes, ag.dimensions, ag.reduction) == ("all-gather", 1024, (1,), None)
    assert (ag.operand_shapes, ag.result_shapes) == (((8, 8),), ((8, 32),))
    assert (rs.kind, rs.bytes, rs.dimensions, rs.reduction) == ("reduce-scatter", 256, (0,), "sum")
    assert (rs.operand_shapes, rs.result_shapes) == (((8, 8),), ((2, 8),))
    assert (a2a.kind, a2a.dimensions, a2a.bytes) == ("all-to-all", (0,), 256)
    assert (cp.kind, cp.dtype, cp.bytes, cp.groups) == ("collective-permute", "bf16", 128, ())
    assert cp.source_target_pairs == ((0, 4), (4, 0))
    assert cp.axes == ("batch",)
    assert bytes_by_kind([ag, rs, a2a, cp]) == {
        "all-gather": 1024,
        "reduce-scatter": 256,
        "all-reduce": 0,
        "all-to-all": 256,
        "collective-permute": 128,
    }


def test_kind_comes_from_the_opcode_not_the_name():
    c = one("  ROOT %all-gather.1 = f32[8,8]{1,0} all-reduce(%p), replica_groups={}, to_apply=%add")
    assert (c.kind, c.name) == ("all-reduce", "all-gather.1")


def test_combined_all_reduce_gives_one_record_per_element():
    body = """  %c = bf16[4]{0} constant({1, 2, 3, 4})
  ROOT %ar = (f32[8,8]{1,0}, bf16[4]{0}) all-reduce(%p, %c), replica_groups={}, to_apply=%add"""
    first, second = parse_collectives(hlo(body), AXES)
    assert (first.name, first.index, first.dtype, first.bytes) == ("ar", 0, "f32", 256)
    assert (second.name, second.index, second.dtype, second.bytes) == ("ar", 1, "bf16", 8)
    assert bytes_by_kind([first, second])["all-reduce"] == 264


def test_tuple_all_to_all_is_one_record():
    body = """  %s0 = f32[2,8]{1,0} slice(%p), slice={[0:2], [0:8]}
  %s1 = f32[2,8]{1,0} slice(%p), slice={[2:4], [0:8]}
  %s2 = f32[2,8]{1,0} slice(%p), slice={[4:6], [0:8]}
  %s3 = f32[2,8]{1,0} slice(%p), slice={[6:8], [0:8]}
  %a2a = (f32[2,8]{1,0}, f32[2,8]{1,0}, f32[2,8]{1,0}, /*index=3*/f32[2,8]{1,0}) all-to-all(%s0, %s1, %s2, %s3), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}
  ROOT %g = f32[2,8]{1,0} get-tuple-element(%a2a), index=0"""
    c = one(body)
    assert (c.kind, c.index, c.dimensions, c.axes) == ("all-to-all", None, None, ("model",))
    assert c.bytes == 4 * 2 * 8 * 4
    assert c.result_shapes == ((2, 8),) * 4


def test_async_start_forms_count_once():
    extra = """
%async_rs (a: f32[8,8]) -> f32[8,2] {
  %a = f32[8,8]{1,0} parameter(0)
  ROOT %rs = f32[8,2]{1,0} reduce-scatter(%a), channel_id=4, replica_groups=[2,4]<=[8], dimensions={1}, to_apply=%add
}
"""
    body = """  %ags = (f32[8,8]{1,0}, f32[8,32]{1,0}) all-gather-start(%p), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}, use_global_device_ids=true
  %agd = f32[8,32]{1,0} all-gather-done(%ags)
  %ars = f32[8,8]{1,0} all-reduce-start(%p), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%max
  %ard = f32[8,8]{1,0} all-reduce-done(%ars)
  %cps = (f32[8,8]{1,0}, f32[8,8]{1,0}, u32[], u32[]) collective-permute-start(%p), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cpd = f32[8,8]{1,0} collective-permute-done(%cps)
  %rss = ((f32[8,8]{1,0}), f32[8,2]{1,0}) async-start(%p), calls=%async_rs
  ROOT %rsd = f32[8,2]{1,0} async-done(%rss)"""
    cs = parse_collectives(hlo(body, extra), AXES)
    summary = [(c.kind, c.name, c.axes, c.bytes, c.is_async) for c in cs]
    assert sorted(summary) == [
        ("all-gather", "ags", ("model",), 1024, True),
        ("all-reduce", "ars", ("batch",), 256, True),
        ("collective-permute", "cps", ("model",), 256, True),
        ("reduce-scatter", "rs", ("model",), 256, True),
    ]
    assert next(c for c in cs if c.name == "ars").reduction == "max"


def test_bare_snippet_and_multiline_instruction():
    text = """
  ag-start = (f32[8,256]{1,0}, f32[16,256]{1,0}) all-gather-start(
      f32[8,256] input), replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0},
      metadata={op_type="AllGather" op_name="a, {weird} (name)"}
  ROOT ag-done = f32[16,256]{1,0} all-gather-done(ag-start)
"""
    (c,) = parse_collectives(text, Mesh({"batch": 2, "model": 4}))
    assert (c.kind, c.name, c.axes, c.line) == ("all-gather", "ag-start", ("batch",), 2)
    assert (c.operand_shapes, c.result_shapes, c.bytes) == (((8, 256),), ((16, 256),), 16384)


def test_transposing_fusions_with_what_they_read_and_write():
    # a layout copy fused with the add that makes its operand reads both inputs; a fusion
    # without a transpose (the bitcast is a relabelling) is not one
    text = """
%copy_fused (a: f32[64,32], b: f32[64,32]) -> f32[32,64] {
  %a = f32[64,32]{1,0} parameter(0)
  %b = f32[64,32]{1,0} parameter(1)
  %s = f32[64,32]{1,0} add(%a, %b)
  %t = f32[32,64]{0,1} transpose(%s), dimensions={1,0}
  ROOT %c = f32[32,64]{1,0} copy(%t)
}

%plain (a: f32[64,32]) -> f32[2048] {
  %a = f32[64,32]{1,0} parameter(0)
  %n = f32[64,32]{1,0} negate(%a)
  ROOT %r = f32[2048]{0} bitcast(%n)
}

ENTRY %main (x: f32[64,32], y: f32[64,32]) -> (f32[32,64], f32[2048]) {
  %x = f32[64,32]{1,0} parameter(0)
  %y = f32[64,32]{1,0} parameter(1)
  %copy_add_fusion = f32[32,64]{1,0} fusion(%x, %y), kind=kLoop, calls=%copy_fused
  %negate_fusion = f32[2048]{0} fusion(%x), kind=kLoop, calls=%plain
  ROOT %out = (f32[32,64]{1,0}, f32[2048]{0}) tuple(%copy_add_fusion, %negate_fusion)
}
"""
    (t,) = parse_transposes(text)
    assert (t.name, t.read, t.written, t.count) == ("copy_add_fusion", 2 * 8192, 8192, 1)


def test_a_transposing_fusion_counts_the_slices_it_touches_of_stacked_arrays():
    # inside a scan, a fusion reads one layer's slice of a stacked array and writes its
    # transposed result into one slice of another, in place: those slices are what moves
    text = """
%fused (stack: f32[4,64,32], out: f32[4,32,64], i: s32[]) -> f32[4,32,64] {
  %stack = f32[4,64,32]{2,1,0} parameter(0)
  %out = f32[4,32,64]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  %ds = f32[1,64,32]{2,1,0} dynamic-slice(%stack, %i, %z, %z), dynamic_slice_sizes={1,64,32}
  %t = f32[1,32,64]{1,2,0} transpose(%ds), dimensions={0,2,1}
  %c = f32[1,32,64]{2,1,0} copy(%t)
  ROOT %dus = f32[4,32,64]{2,1,0} dynamic-update-slice(%out, %c, %i, %z, %z)
}

ENTRY %main (x: f32[4,64,32], y: f32[4,32,64], i: s32[]) -> f32[4,32,64] {
  %x = f32[4,64,32]{2,1,0} parameter(0)
  %y = f32[4,32,64]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  ROOT %f = f32[4,32,64]{2,1,0} fusion(%x, %y, %i), kind=kLoop, calls=%fused
}
"""
    (t,) = parse_transposes(text)
    assert (t.read, t.written) == (8192 + 4, 8192)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "  ROOT %ar = f32[8,8]{1,0} all-reduce(%p), replica_groups=bogus, to_apply=%add",
            "line 17",
        ),
        (
            "  %ar = f32[8,8]{1,0} all-reduce(%p), replica_groups={{0,9}}, to_apply=%add",
            "line 17.*9",
        ),
        ("  %ar = f32[8,8]{1,0} all-reduce(%p), replica_groups={0,1}, to_apply=%add", "line 17"),
        ("  what is this", "line 17"),
        ("  ROOT %ag = f32[8,9]{1,0} all-gather(%p), replica_groups={}, dimensions={1}", "line 17"),
    ],
)
def test_unparseable_input_names_the_line(body, message):
    with pytest.raises(ValueError, match=message):
        parse_collectives(hlo(body), AXES)


# ------------------------------------------------------------------------ CPU normalization


def ar_then_slice(offset: str, *, extra_use: bool = False) -> str:
    body = f"""  %q = f32[16,8]{{1,0}} concatenate(%p, %p), dimensions={{0}}
  %ar = f32[16,8]{{1,0}} all-reduce(%q), replica_groups={{{{0,1,2,3}},{{4,5,6,7}}}}, to_apply=%add
  %pid = u32[] partition-id()
  %four = u32[] constant(4)
  %rem = u32[] remainder(%pid, %four)
  %off = u32[] multiply(%rem, %four)
  %zero = u32[] constant(0)
  %ds = f32[4,8]{{1,0}} dynamic-slice(%ar, {offset}, %zero), dynamic_slice_sizes={{4,8}}
  ROOT %out = (f32[4,8]{{1,0}}, f32[16,8]{{1,0}}) tuple(%ds, {"%ar" if extra_use else "%q"})"""
    return hlo(body)


def test_normalize_cpu_all_reduce_plus_dynamic_slice():
    text = ar_then_slice("%off")
    (raw,) = parse_collectives(text, AXES)
    (c,) = normalize_cpu([raw], text)
    assert (raw.kind, raw.bytes, raw.via_dynamic_slice) == ("all-reduce", 512, False)
    assert (c.kind, c.axes, c.dimensions, c.reduction) == (
        "reduce-scatter",
        ("model",),
        (0,),
        "sum",
    )
    assert c.bytes == 16 * 8 * 4  # the input's, as for any reduce-scatter
    assert (c.operand_shapes, c.result_shapes, c.via_dynamic_slice) == (((16, 8),), ((4, 8),), True)


@pytest.mark.parametrize(("offset", "extra_use"), [("%zero", False), ("%off", True)])
def test_normalize_cpu_leaves_other_all_reduces(offset, extra_use):
    text = ar_then_slice(offset, extra_use=extra_use)
    (c,) = normalize_cpu(parse_collectives(text, AXES), text)
    assert (c.kind, c.via_dynamic_slice) == ("all-reduce", False)


# ---------------------------------------------------------------------- compiled programs


@pytest.fixture(scope="module")
def mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("batch", "model"))


X = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)  # per device (8, 8): 256 bytes
BOTH = ("batch", "model")
RING4 = [(i, (i + 1) % 4) for i in range(4)]
RING8 = [(i, (i + 1) % 8) for i in range(8)]

BODIES = {
    "psum-model": lambda a: lax.psum(a, "model"),
    "psum-both": lambda a: lax.psum(a, BOTH),
    "pmax-batch": lambda a: lax.pmax(a, "batch"),
    "pmax-both": lambda a: lax.pmax(a, BOTH),
    "pmin-model-batch": lambda a: lax.pmin(a, ("model", "batch")),
    "all-gather-model": lambda a: lax.all_gather(a, "model", axis=1, tiled=True),
    "all-gather-both": lambda a: lax.all_gather(a, BOTH, axis=0, tiled=True),
    "psum-scatter-model": lambda a: lax.psum_scatter(a, "model", scatter_dimension=1, tiled=True),
    "psum-scatter-both": lambda a: lax.psum_scatter(a, BOTH, scatter_dimension=0, tiled=True),
    "all-to-all-model": lambda a: lax.all_to_all(a, "model", 0, 1, tiled=True),
    "all-to-all-both": lambda a: lax.all_to_all(a, BOTH, 0, 1, tiled=True),
    "ppermute-model": lambda a: lax.ppermute(a, "model", RING4),
    "ppermute-batch": lambda a: lax.ppermute(a, "batch", [(0, 1), (1, 0)]),
    "ppermute-both": lambda a: lax.ppermute(a, BOTH, RING8),
}
EXPECTED = {  # kind, axes, bytes per device, reduction, a per-device result shape
    "psum-model": ("all-reduce", ("model",), 256, "sum", (8, 8)),
    "psum-both": ("all-reduce", BOTH, 256, "sum", (8, 8)),
    "pmax-batch": ("all-reduce", ("batch",), 256, "max", (8, 8)),
    "pmax-both": ("all-reduce", BOTH, 256, "max", (8, 8)),
    "pmin-model-batch": ("all-reduce", ("model", "batch"), 256, "min", (8, 8)),
    "all-gather-model": ("all-gather", ("model",), 1024, None, (8, 32)),
    "all-gather-both": ("all-gather", BOTH, 2048, None, (64, 8)),
    "psum-scatter-model": ("reduce-scatter", ("model",), 256, "sum", (8, 2)),
    "psum-scatter-both": ("reduce-scatter", BOTH, 256, "sum", (1, 8)),
    "all-to-all-model": ("all-to-all", ("model",), 256, None, (2, 8)),
    "all-to-all-both": ("all-to-all", BOTH, 256, None, (1, 8)),
    "ppermute-model": ("collective-permute", ("model",), 256, None, (8, 8)),
    "ppermute-batch": ("collective-permute", ("batch",), 256, None, (8, 8)),
    "ppermute-both": ("collective-permute", BOTH, 256, None, (8, 8)),
}


@pytest.mark.parametrize("case", list(BODIES))
def test_shard_map_collectives(mesh, case):
    kind, axes, nbytes, reduction, shape = EXPECTED[case]
    spec = P("batch", "model")
    f = jax.shard_map(BODIES[case], mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    text = jax.jit(f).lower(X).compile().as_text()
    cs = normalize_cpu(parse_collectives(text, AXES), text)
    (c,) = cs
    assert (c.kind, c.axes, c.bytes, c.reduction, c.dtype) == (kind, axes, nbytes, reduction, "f32")
    assert shape in c.result_shapes
    assert not c.via_dynamic_slice
    if kind == "collective-permute":
        assert len(c.source_target_pairs) == 8
    assert bytes_by_kind(cs)[kind] == nbytes


def compiled(mesh, f, in_specs, out_specs, *args) -> str:
    def to_sharding(spec):
        return NamedSharding(mesh, spec)

    jitted = jax.jit(
        f,
        in_shardings=jax.tree.map(to_sharding, in_specs),
        out_shardings=jax.tree.map(to_sharding, out_specs),
    )
    return jitted.lower(*args).compile().as_text()


W = np.ones((32, 8), np.float32)


def test_jit_contracting_dim_sharded_gives_all_reduce(mesh):
    text = compiled(mesh, jnp.matmul, (P(None, "model"), P("model", None)), P(), X, W)
    (c,) = normalize_cpu(parse_collectives(text, AXES), text)
    assert (c.kind, c.axes, c.reduction, c.bytes) == ("all-reduce", ("model",), "sum", 16 * 8 * 4)


def test_jit_reshard_dim0_to_dim1_gives_all_to_all(mesh):
    text = compiled(mesh, lambda a: a * 2, P("model", None), P(None, "model"), X)
    (c,) = parse_collectives(text, AXES)
    assert (c.kind, c.axes, c.bytes) == ("all-to-all", ("model",), 4 * 32 * 4)


def test_jit_replicating_gives_all_gathers(mesh):
    text = compiled(mesh, lambda a: a * 2, P("model", "batch"), P(), X)
    cs = parse_collectives(text, AXES)
    assert sorted((c.kind, c.axes, c.dimensions) for c in cs) == [
        ("all-gather", ("batch",), (1,)),
        ("all-gather", ("model",), (0,)),
    ]
    assert bytes_by_kind(cs)["all-gather"] == (4 * 32 + 16 * 32) * 4


def test_jit_sharded_matmul_output_is_a_reduce_scatter_on_cpu(mesh):
    text = compiled(mesh, jnp.matmul, (P(None, "model"), P("model", None)), P("model"), X, W)
    raw = parse_collectives(text, AXES)
    assert [c.kind for c in raw] == ["all-reduce"]
    (c,) = normalize_cpu(raw, text)
    assert (c.kind, c.axes, c.dimensions, c.via_dynamic_slice) == (
        "reduce-scatter",
        ("model",),
        (0,),
        True,
    )
    assert c.result_shapes == ((4, 8),)
    assert bytes_by_kind([c]) == {**bytes_by_kind([]), "reduce-scatter": 16 * 8 * 4}


def two_matmuls(a, b, c):
    return a @ b, a @ c


def test_jit_combined_reduce_scatters(mesh):
    specs = (P(None, "model"), P("model", None), P("model", None))
    text = compiled(
        mesh, two_matmuls, specs, (P("model"), P("model")), X, W, np.ones((32, 16), np.float32)
    )
    cs = normalize_cpu(parse_collectives(text, AXES), text)
    assert {c.kind for c in cs} == {"reduce-scatter"}
    assert all(c.axes == ("model",) and c.via_dynamic_slice for c in cs)
    assert bytes_by_kind(cs)["reduce-scatter"] == (16 * 8 + 16 * 16) * 4


def test_jit_roll_gives_collective_permute(mesh):
    text = compiled(mesh, lambda a: jnp.roll(a, 1, axis=0), P("model"), P("model"), X)
    (c,) = parse_collectives(text, AXES)
    assert (c.kind, c.axes, c.bytes) == ("collective-permute", ("model",), 32 * 4)
