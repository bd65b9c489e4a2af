"""One process of a two-process run of an exported plan (see test_multiprocess.py).

    python multiprocess_worker.py PROCESS_ID PORT EXPORTED.py MODEL OUT.npz

MODEL: a zoo model's name, its tiny preset ("lm"), or with its layers ("lm:4").

Four virtual CPU devices per process, collectives over gloo; the exported module builds its
mesh from every process's devices and runs the step on global arrays. The workbench is
imported only to build the model's step and its example arguments.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, exported, model, out_path = sys.argv[1:6]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))

import types  # noqa: E402

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from workbench.models import build, lm  # noqa: E402


def example(model: str):
    """The zoo model's tiny example; "lm:4": the LM with 4 layers."""
    name, _, layers = model.partition(":")
    if not layers:
        return build(name, "tiny")
    assert name == "lm", model
    return build(name, lm.Config.preset("tiny", n_layers=int(layers)))


def process_local(full: np.ndarray, sharding: NamedSharding) -> np.ndarray:
    """The block of ``full`` this process's devices hold (a box: devices fill the mesh in
    order)."""
    indices = sharding.addressable_devices_indices_map(full.shape).values()
    box = []
    for d in range(full.ndim):
        starts = [ix[d].start or 0 for ix in indices]
        stops = [full.shape[d] if ix[d].stop is None else ix[d].stop for ix in indices]
        box.append(slice(min(starts), max(stops)))
    return full[tuple(box)]


def main() -> None:
    module = types.ModuleType("exported")
    with open(exported) as f:
        exec(compile(f.read(), exported, "exec"), module.__dict__)
    ex = example(model)
    mesh = module.make_mesh()
    leaves, tree = jax.tree_util.tree_flatten(ex.args)
    arrays = []
    for leaf, spec in zip(leaves, module.IN_SPECS):
        full = np.asarray(leaf)
        sharding = NamedSharding(mesh, spec)
        arrays.append(
            jax.make_array_from_process_local_data(
                sharding, process_local(full, sharding), full.shape
            )
        )
    out = module.partitioned(ex.fn, mesh)(*jax.tree_util.tree_unflatten(tree, arrays))
    gathered = [
        np.asarray(x) for x in multihost_utils.process_allgather(jax.tree.leaves(out), tiled=True)
    ]
    np.savez(
        out_path,
        process_count=jax.process_count(),
        device_count=jax.device_count(),
        local_devices=jax.local_device_count(),
        **{f"out{i}": x for i, x in enumerate(gathered)},
    )
    jax.distributed.shutdown()


main()
