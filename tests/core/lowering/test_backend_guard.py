"""A known XLA fault, reproduced in plain JAX, and the guard that keeps the constrained
lowering and the plain-JAX export away from it: on CPU, a convolution tiled on a spatial
dimension gets wrong gradients (the kernel gradient counted once per replica)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import workbench as wb
from tests.core.zoo import program
from workbench.core.lowering import constrained
from workbench.core.lowering.constrained import spatial_tilings

MESH = wb.Mesh({"batch": 2, "model": 4})
SPATIAL = [wb.Tile("batch/images", 1, "batch")]  # the image's height, NHWC


def _conv(x, w):
    return jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the fault is XLA:CPU's")
@pytest.mark.xfail(
    strict=True,
    reason="XLA:CPU's SPMD partitioner computes a conv's kernel gradient 4x too large when the "
    "input's height is tiled on 2 of 8 devices; when this passes, XLA is fixed and "
    "lowering.constrained.SPATIAL_CONV_FAULTY (the guard) can lose 'cpu'",
)
def test_xla_cpu_gets_conv_gradients_right_under_a_spatial_constraint():
    # smallest reliable case: one 4x4 single-channel image, a 3x3 kernel, height over 2 of
    # a {2, 4} mesh (over all 8 devices, or a 1x1 kernel, the gradients are right)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("s", "r"))
    tiled = NamedSharding(mesh, PartitionSpec(None, "s"))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 4, 4, 1)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 1, 1)), jnp.float32)

    def loss(x, w, constrain):
        x = jax.lax.with_sharding_constraint(x, tiled) if constrain else x
        return jnp.sum(_conv(x, w) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    for got, want in zip(grad(x, w, True), grad(x, w, False)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_spatial_tilings_are_read_from_the_convolutions_mappings():
    s = wb.Session(program("cnn"), MESH, SPATIAL)
    found = spatial_tilings(s.program, s.state)
    assert {(t.value, t.dim, t.axes) for t in found} == {("batch/images", 1, ("batch",))}
    assert len(found) == 2  # the forward conv and its kernel-gradient conv both read it
    assert not spatial_tilings(s.program, wb.Session(program("cnn"), MESH, [wb.BP("batch")]).state)


def test_the_constrained_lowering_refuses_a_spatially_tiled_conv_on_cpu():
    s = wb.Session(program("cnn"), MESH, SPATIAL)
    with pytest.raises(wb.WorkbenchError, match=r"spatial dimension.*wrong gradients.*explicit"):
        s.lower("constrained")
    s.lower("explicit")  # what would work
    wb.Session(program("cnn"), MESH, [wb.BP("batch")]).lower("constrained")  # batch: fine


def test_the_guard_is_kept_to_the_faulty_backends(monkeypatch):
    monkeypatch.setattr(constrained, "SPATIAL_CONV_FAULTY", frozenset({"tpu"}))
    wb.Session(program("cnn"), MESH, SPATIAL).lower("constrained")


@pytest.mark.slow
def test_the_explicit_lowering_runs_the_spatial_tiling_right():
    assert wb.Session(program("cnn"), MESH, SPATIAL).run(repeats=1).matches


def _exported(session):
    module = types.ModuleType("exported")
    exec(compile(session.export_jax(), "<exported>", "exec"), module.__dict__)
    return module


def test_the_plain_jax_export_names_spatial_convs_and_refuses_them_on_cpu():
    module = _exported(wb.Session(program("cnn"), MESH, SPATIAL))
    assert len(module.SPATIAL_CONVS) == 2 and "batch/images" in module.SPATIAL_CONVS[0]
    assert "cpu" in module.FAULTY_BACKENDS
    with pytest.raises(RuntimeError, match=r"spatial dimension.*wrong gradients"):
        module.partitioned(lambda *a: a)
    clean = _exported(wb.Session(program("cnn"), MESH, [wb.BP("batch")]))
    assert clean.SPATIAL_CONVS == []
    clean.partitioned(lambda *a: a)  # no refusal without the pattern
