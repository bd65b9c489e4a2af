"""Programs and DOT-reading helpers for the viz tests (the model zoo is not needed)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

import workbench as wb

MESH = wb.Mesh({"batch": 2, "model": 4})


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def mlp(params, x):
    h = jax.nn.relu(x @ params["w_in"])
    return h @ params["w_out"] + x


MLP_ARGS = ({"w_in": sds(16, 32), "w_out": sds(32, 16)}, sds(8, 16))


def dense_step(n_layers: int, width: int = 16, batch: int = 8):
    """A training step: ``n_layers`` tanh layers under ``layer<i>`` scopes, grad, SGD."""

    def loss(params, x):
        for i in range(n_layers):
            with jax.named_scope(f"layer{i}"):
                x = jnp.tanh(x @ params[f"w{i}"])
        return jnp.mean(x**2)

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        with jax.named_scope("optimizer"):
            params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        return value, params

    params = {f"w{i}": sds(width, width) for i in range(n_layers)}
    return wb.capture(step, params, sds(batch, width))


def lm_step(n_layers: int = 24, d: int = 64, f: int = 256, b: int = 4, t: int = 16, h: int = 4):
    """A transformer-like training step with thousands of ops: attention and MLP per layer."""

    def layer(p, x):
        with jax.named_scope("ln"):
            mu = x.mean(-1, keepdims=True)
            x1 = (x - mu) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)
        with jax.named_scope("attn"):
            q, k, v = ((x1 @ p[w]).reshape(b, t, h, d // h) for w in ("wq", "wk", "wv"))
            a = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / 8.0, axis=-1)
            x = x + jnp.einsum("bhts,bshd->bthd", a, v).reshape(b, t, d) @ p["wo"]
        with jax.named_scope("mlp"):
            return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]

    def loss(params, x):
        for i, p in enumerate(params["layers"]):
            with jax.named_scope(f"layer{i}"):
                x = layer(p, x)
        return jnp.mean(x**2)

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        with jax.named_scope("optimizer"):
            params = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
        return value, params

    shapes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, f), "w2": (f, d)}
    layer_params = {k: sds(*s) for k, s in shapes.items()}
    return wb.capture(step, {"layers": [layer_params] * n_layers}, sds(b, t, d))


# -- reading DOT source ----------------------------------------------------------------------
_ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|<<.*?>>|[^\s\]]+)')
_NODE = re.compile(r"^\s*(\w+) \[(.*)\]$", re.M)
_EDGE = re.compile(r"^\s*(\w+) -> (\w+) \[(.*)\]$", re.M)


def _attrs(text: str) -> dict[str, str]:
    out = {}
    for key, value in _ATTR.findall(text):
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"')
        out[key] = value.replace("\\n", "\n")
    return out


def nodes(graph) -> dict[str, dict[str, str]]:
    """Node name -> its attributes (labels and tooltips with real newlines)."""
    return {
        m[1]: _attrs(m[2])
        for m in _NODE.finditer(graph.source)
        if m[1] not in ("graph", "node", "edge")
    }


def edges(graph) -> list[tuple[str, str, dict[str, str]]]:
    """``(tail, head, attributes)`` as written (edges drawn upwards have ``dir=back``)."""
    return [(m[1], m[2], _attrs(m[3])) for m in _EDGE.finditer(graph.source)]


def flow(graph) -> list[tuple[str, str, dict[str, str]]]:
    """Edges in the direction values flow (``dir=back`` edges turned around)."""
    return [(h, t, a) if a.get("dir") == "back" else (t, h, a) for t, h, a in edges(graph)]


def edge_of(graph, value_name: str) -> tuple[str, str, dict[str, str]]:
    """The one edge whose tooltip lists ``value_name`` first."""
    found = [e for e in flow(graph) if e[2].get("tooltip", "").startswith(value_name + ":")]
    assert len(found) == 1, (value_name, found)
    return found[0]
