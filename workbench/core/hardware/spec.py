"""The hardware spec the simulator prices a step on: one device and the levels between devices.

A `Hardware` holds one device's peak FLOP/s per dtype, its memory bandwidth and capacity,
the figures beyond the roofline that ``calibrate()`` measures (kernel overhead, transpose
bandwidth, fresh memory), and the interconnect as a list of levels, innermost first: each
a `Link` with its group size, alpha-beta figures and topology (``links[0]`` joins the
devices of a node: TPU ICI in a slice, GPU NVLink; the last joins everything: DCN,
InfiniBand). Every figure names its source in ``sources``.

A mesh axis runs its collectives on the levels its placement spreads it over
(``placement.py``; the mesh order's unless ``with_placement`` gives one), unless
``with_axis_links`` names its link. Collectives: ``collectives.py``; presets: ``presets/``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from workbench.core.errors import MeshError, given
from workbench.core.hardware.levels import (
    HardwareError,
    Link,
    finite_nonneg,
    positive,
    positive_int,
)
from workbench.core.hardware.placement import Placement, placed, spread
from workbench.core.hardware.rates import dtype_name, fallback_chain, looked_up
from workbench.core.hardware.tiles import Tiles
from workbench.core.hardware.torus import torus_link, with_torus
from workbench.core.layout.mesh import Mesh

#: XLA's default threshold of its all-reduce combiner (GPU, and the pass's own default).
XLA_COMBINE_BYTES = 30 * 2**20 + 7
#: XLA's CPU compiler combines all-reduces without a byte limit (256 operands at most).
XLA_CPU_COMBINE_BYTES = float(2**63 - 1)


@dataclass(frozen=True, slots=True)
class Hardware:
    """One device type and how devices connect (see the module docstring)."""

    name: str
    flops: dict[str, float]  # peak FLOP/s per dtype name ("bfloat16", "float32", "int8", ...)
    hbm_bandwidth: float  # bytes/s between the device and its memory
    memory_bytes: float  # memory capacity per device
    links: tuple[Link, ...]  # the levels, innermost first: links[0] joins a node's devices
    # devices joined by links[0]: its group size (filled in where that level gives none)
    devices_per_node: int | None = None
    sources: dict[str, str] = field(default_factory=dict)  # figure key -> where it comes from
    axis_links: tuple[tuple[str, str], ...] = ()  # explicit (mesh axis, link name) choices
    notes: str = ""
    op_overhead: float = 0.0  # seconds each kernel costs beyond its roofline (launch, dispatch)
    # bytes/s of a transposing copy, or ((array bytes, bytes/s), ...) measured at several
    # sizes (see `copy_bandwidth`); None: hbm_bandwidth
    transpose_bandwidth: float | tuple[tuple[float, float], ...] | None = None
    # the runtime combines independent all-reduces into one of up to this many bytes
    all_reduce_combine_bytes: float = XLA_COMBINE_BYTES
    # a per-step buffer above this many bytes is fresh memory each step (None: reused)
    fresh_buffer_bytes: float | None = None
    first_touch_bandwidth: float | None = None  # bytes/s of touching fresh memory (None: free)
    # whether the compiler fuses an elementwise value into each reader that can take it
    # (XLA's CPU instruction fusion: a residual sum is recomputed in every later layer's
    # transposed copies, measured) rather than into all of its readers or none (XLA's GPU
    # priority fusion: a value a matmul also reads is written once; TPU alike)
    fuses_per_reader: bool = False
    # where the mesh's axes lie on the levels (None: in mesh order, the last axis innermost)
    placement: Placement | None = None
    #: per dtype, the share of the peak a large matmul reaches, measured (cited in
    #: ``sources``); a dtype without one falls back as its peak does, else 1
    matmul_efficiency: Mapping[str, float] = field(default_factory=dict)
    #: per dtype, the share of the peak a fused attention kernel reaches, published (cited);
    #: a dtype without one takes the matmul's (``attention_flops``)
    attention_efficiency: Mapping[str, float] = field(default_factory=dict)
    #: whether attention runs as fused (flash-style) kernels: the program calls them, or the
    #: compiler rewrites the pattern (``estimate/fused.py``); False: as the program writes it
    fused_attention: bool = False
    matmul_tiles: Tiles | None = None  # how its matrix units cut a matmul (``tiles.py``)

    def __post_init__(self):
        _check_kinds(self)
        flops = {dtype_name(k): v for k, v in dict(self.flops).items()}
        object.__setattr__(self, "sources", dict(self.sources))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "axis_links", tuple(tuple(p) for p in self.axis_links))
        if not flops or not all(positive(v) for v in flops.values()):
            raise HardwareError(
                f"hardware {self.name!r} needs positive peak FLOP/s per dtype, e.g. "
                f"{{'bfloat16': 1e15}}; got {self.flops!r}."
            )
        object.__setattr__(self, "flops", {k: float(v) for k, v in flops.items()})
        for what, kernel in (
            ("matmul_efficiency", "a matmul"),
            ("attention_efficiency", "a fused attention"),
        ):
            shares = getattr(self, what)
            eff = {dtype_name(k): v for k, v in dict(shares).items()}
            if not all(isinstance(v, int | float) and 0 < v <= 1 for v in eff.values()):
                raise HardwareError(
                    f"hardware {self.name!r} has {what}={shares!r}; give each dtype's share of "
                    f"its peak {kernel} reaches, in (0, 1]."
                )
            object.__setattr__(self, what, {k: float(v) for k, v in eff.items()})
        for what in ("hbm_bandwidth", "memory_bytes"):
            if not positive(getattr(self, what)):
                unit = "bytes per second" if what == "hbm_bandwidth" else "bytes"
                raise HardwareError(
                    f"hardware {self.name!r} has {what}={given(getattr(self, what))}; "
                    f"it must be a positive, finite number of {unit}."
                )
        if not self.links or not all(isinstance(x, Link) for x in self.links):
            raise HardwareError(
                f"hardware {self.name!r} needs at least one Link, innermost first; "
                f"got {self.links!r}."
            )
        names = [x.name for x in self.links]
        if len(set(names)) != len(names):
            raise HardwareError(f"hardware {self.name!r} has duplicate link names {names}.")
        self._settle_levels()
        for _, link_name in self.axis_links:
            self._link_named(link_name)
        if not finite_nonneg(self.op_overhead):
            raise HardwareError(
                f"hardware {self.name!r} has op_overhead={self.op_overhead!r}; it must be a "
                "non-negative number of seconds per kernel (0 to ignore launch overhead)."
            )
        if not positive(self.all_reduce_combine_bytes):
            raise HardwareError(
                f"hardware {self.name!r} has all_reduce_combine_bytes="
                f"{self.all_reduce_combine_bytes!r}; it must be a positive number of bytes "
                f"(XLA's default is {XLA_COMBINE_BYTES})."
            )
        object.__setattr__(self, "transpose_bandwidth", _rate_curve(self))
        for what in ("fresh_buffer_bytes", "first_touch_bandwidth"):
            value = getattr(self, what)
            if value is not None and not positive(value):
                raise HardwareError(
                    f"hardware {self.name!r} has {what}={value!r}; give a positive number of "
                    "bytes (per second), or None where the runtime reuses its memory."
                )

    def _settle_levels(self):
        """Fill the first level's group size from ``devices_per_node`` (or the reverse), check
        that every level but the outermost has one, and file each level's sources both on the
        level and in ``sources`` (``links.<name>.<figure>``; the first level's group size as
        ``devices_per_node``)."""
        first, per_node = self.links[0], self.devices_per_node
        if per_node is not None and not positive_int(per_node):
            raise HardwareError(
                f"hardware {self.name!r} has devices_per_node={per_node!r}; "
                "it must be a positive integer."
            )
        if first.group_size is None and per_node is None:
            raise HardwareError(
                f"hardware {self.name!r} does not say how many devices its first level "
                f"{first.name!r} joins; give Link(..., group_size=n) or devices_per_node=n."
            )
        if first.group_size is not None and per_node not in (None, first.group_size):
            raise HardwareError(
                f"hardware {self.name!r} has devices_per_node={per_node!r} but its first level "
                f"{first.name!r} has group_size={first.group_size}; give one of them, or both "
                f"alike (`with_group_sizes({{{first.name!r}: n}})` changes a spec's)."
            )
        for x in self.links[1:-1]:
            if x.group_size is None:
                raise HardwareError(
                    f"hardware {self.name!r}: level {x.name!r} has no group_size; every level "
                    "but the outermost says how many groups of the level below it joins."
                )
        levels = []
        for i, x in enumerate(self.links):
            size = per_node if i == 0 and x.group_size is None else x.group_size
            mine = dataclasses.replace(x, group_size=size)
            flat = _flat_keys(mine, first=i == 0)
            filed = {key: self.sources[k] for key, k in flat.items() if k in self.sources}
            sources = filed | dict(x.sources)
            self.sources.update({flat[key]: text for key, text in sources.items() if key in flat})
            levels.append(dataclasses.replace(mine, sources=sources))
        object.__setattr__(self, "links", tuple(levels))
        object.__setattr__(self, "devices_per_node", self.links[0].group_size)

    def __hash__(self):
        return hash(
            (
                self.name,
                tuple(sorted(self.flops.items())),
                tuple(sorted(self.matmul_efficiency.items())),
                tuple(sorted(self.attention_efficiency.items())),
                self.fused_attention,
                self.matmul_tiles,
                self.links,
                self.axis_links,
                self.op_overhead,
                self.transpose_bandwidth,
                self.all_reduce_combine_bytes,
                self.fresh_buffer_bytes,
                self.first_touch_bandwidth,
                self.placement,
            )
        )

    def fresh_memory_time(self, buffers: Iterable[float]) -> float:
        """Seconds per step to first touch those of ``buffers`` (bytes each, allocated every
        step) that the runtime takes fresh from the operating system: each one above
        ``fresh_buffer_bytes``, at ``first_touch_bandwidth`` (0 where either is None)."""
        threshold, rate = self.fresh_buffer_bytes, self.first_touch_bandwidth
        if threshold is None or rate is None:
            return 0.0
        return sum(b for b in buffers if b > threshold) / rate

    def copy_bandwidth(self, nbytes: float | None = None) -> float:
        """Bytes/s of a transposing (layout-changing) copy of an array of ``nbytes``:
        ``transpose_bandwidth`` (between measured sizes interpolated on log-log axes, beyond
        them the nearest; without a size their median), else the HBM bandwidth."""
        curve = self.transpose_bandwidth
        if curve is None:
            return self.hbm_bandwidth
        if isinstance(curve, float):
            return curve
        if nbytes is None:
            return statistics.median(rate for _, rate in curve)
        sizes = [size for size, _ in curve]
        i = bisect.bisect_left(sizes, nbytes)
        if i == 0:
            return curve[0][1]
        if i == len(curve):
            return curve[-1][1]
        (s0, r0), (s1, r1) = curve[i - 1], curve[i]
        w = math.log(nbytes / s0) / math.log(s1 / s0)
        return math.exp(math.log(r0) + w * math.log(r1 / r0))

    def __str__(self):
        peak = ", ".join(f"{k} {v:.3g}" for k, v in self.flops.items())
        links = ", ".join(f"{x.name} {x.bandwidth:.3g} B/s" for x in self.links)
        return (
            f"{self.name}: {peak} FLOP/s; HBM {self.hbm_bandwidth:.3g} B/s, "
            f"{self.memory_bytes:.3g} B; {links}; {self.devices_per_node} devices/node"
        )

    # -- figures ----------------------------------------------------------------------------
    def figures(self) -> dict[str, float]:
        """Every number of the spec under the key its source is filed under in ``sources``."""
        out = {f"flops.{k}": v for k, v in self.flops.items()}
        out |= {f"matmul_efficiency.{k}": v for k, v in self.matmul_efficiency.items()}
        out |= {f"attention_efficiency.{k}": v for k, v in self.attention_efficiency.items()}
        out |= self.matmul_tiles.figures() if self.matmul_tiles is not None else {}
        out["hbm_bandwidth"] = self.hbm_bandwidth
        out["memory_bytes"] = self.memory_bytes
        for i, x in enumerate(self.links):
            flat = _flat_keys(x, first=i == 0)
            out |= {flat[k]: v for k, v in x.figures().items() if k != "group_size" or i}
        out["devices_per_node"] = self.devices_per_node
        if self.op_overhead:  # listed only when set: presets leave it at 0
            out["op_overhead"] = self.op_overhead
        if isinstance(self.transpose_bandwidth, float):
            out["transpose_bandwidth"] = self.transpose_bandwidth
        elif self.transpose_bandwidth is not None:
            for size, rate in self.transpose_bandwidth:
                out[f"transpose_bandwidth.{size:.0f}"] = rate
        out["all_reduce_combine_bytes"] = self.all_reduce_combine_bytes
        for what in ("fresh_buffer_bytes", "first_touch_bandwidth"):
            if getattr(self, what) is not None:
                out[what] = getattr(self, what)
        return out

    def peak_flops(self, dtype=None) -> float:
        """Peak FLOP/s for arithmetic in ``dtype`` (a numpy/JAX dtype or its name).

        A dtype the spec does not list falls back along `FALLBACKS`, then to float32,
        then to bfloat16: float32 -> bfloat16 because JAX's default matmul precision
        does a float32 dot as one bfloat16 pass on TPU (TF32 on recent GPUs, which
        the GPU presets list as their float32 figure; see
        https://docs.jax.dev/en/latest/201/precision.html); float16 <-> bfloat16;
        float8 and int8 without their own rate run at the bfloat16 rate; anything
        else (float64, int32, ...) at the float32 rate, which is optimistic for
        float64 on chips that emulate it. ``None`` means float32.
        """
        name = dtype_name(dtype if dtype is not None else "float32")
        for candidate in fallback_chain(name):
            if candidate in self.flops:
                return self.flops[candidate]
        raise HardwareError(
            f"hardware {self.name!r} has no peak FLOP/s for {name!r} nor any fallback "
            f"({', '.join(fallback_chain(name)[1:])}); it lists {sorted(self.flops)}. "
            "Add the rate to `flops`."
        )

    def matmul_flops(self, dtype=None) -> float:
        """FLOP/s a large matmul in ``dtype`` reaches: the peak times its measured share."""
        return self.peak_flops(dtype) * looked_up(
            self.matmul_efficiency, dtype if dtype is not None else "float32", 1.0
        )

    def attention_flops(self, dtype=None) -> float:
        """FLOP/s a fused attention kernel in ``dtype`` reaches: the peak times its published
        share, else a matmul's (`matmul_flops`)."""
        share = looked_up(self.attention_efficiency, dtype if dtype is not None else "float32")
        return self.peak_flops(dtype) * share if share is not None else self.matmul_flops(dtype)

    # -- links --------------------------------------------------------------------------------
    def with_axis_links(self, mapping: Mapping[str, str]) -> Hardware:
        """A copy where the given mesh axes use the named links, e.g.
        ``H100.with_axis_links({"model": "nvlink", "batch": "infiniband"})``.
        Merges with earlier choices; the newer wins."""
        _check_mapping(self, "with_axis_links", mapping, '{"model": "nvlink"}')
        for axis, link_name in mapping.items():
            if not isinstance(axis, str):
                raise HardwareError(f"mesh axis names are strings; got {axis!r}.")
            self._link_named(link_name)
        merged = dict(self.axis_links) | dict(mapping)
        return dataclasses.replace(self, axis_links=tuple(sorted(merged.items())))

    def with_group_sizes(self, sizes: Mapping[str, int | None]) -> Hardware:
        """A copy where the named levels join other numbers of groups, e.g.
        ``H100.with_group_sizes({"nvlink": 16})`` for 16 GPUs per NVLink node."""
        _check_mapping(self, "with_group_sizes", sizes, '{"nvlink": 16}')
        for name in sizes:
            self._link_named(name)
        links = tuple(
            dataclasses.replace(x, group_size=sizes.get(x.name, x.group_size)) for x in self.links
        )
        return dataclasses.replace(self, links=links, devices_per_node=links[0].group_size)

    def with_torus(self, dims, level: str | None = None) -> Hardware:
        """A copy whose torus ``level`` (default: the first torus) is a slice of ``dims``,
        fastest first, e.g. ``TPU_V5P.with_torus((4, 4, 8))``: its group size is their
        product, and collectives over its dimensions get the links they use (``torus.py``)."""
        return with_torus(self, dims, level)

    def with_placement(self, placement: Placement | None) -> Hardware:
        """A copy whose collectives run where ``placement`` puts the mesh's axes (one of
        ``Session.placements(hardware)``; None: the mesh order)."""
        if placement is not None and not isinstance(placement, Placement):
            raise HardwareError(
                f"{self.name!r}.with_placement({given(placement)}): give a Placement (one of "
                "Session.placements(hardware)) or None for the mesh order."
            )
        if placement is not None and placement.levels != tuple(x.name for x in self.links):
            raise HardwareError(
                f"placement {placement} is on levels {placement.levels}, but {self.name!r} "
                f"has {tuple(x.name for x in self.links)}."
            )
        return dataclasses.replace(self, placement=placement)

    def spread(self, mesh: Mesh, axes) -> list[tuple[Link, int]]:
        """``(level, group size)`` a collective over mesh ``axes`` forms on each level it
        crosses, innermost first: by the placement (the given one, or the mesh order's);
        an axis ``with_axis_links`` names, or one no placement splits evenly, whole on
        its link (`link`)."""
        explicit = dict(self.axis_links)
        placement = placed(self.placement, mesh, self.links)
        groups: dict[int, int] = {}
        for axis in axes:
            _check_axis(mesh, axis)
            if axis in explicit or placement is None:
                j = [x.name for x in self.links].index(self.link(mesh, axis).name)
                groups[j] = groups.get(j, 1) * mesh.axis_size(axis)
                continue
            for j, n in spread(placement, (axis,)).items():
                groups[j] = groups.get(j, 1) * n
        if placement is None or any(a in explicit for a in axes):
            return [(self.links[j], n) for j, n in sorted(groups.items())]
        on = [a in axes for a in mesh.names]  # a torus level's dims: the group's share (torus.py)
        return [
            (torus_link(self.links[j], [fs[j] for _, fs in placement.factors], on), n)
            for j, n in sorted(groups.items())
        ]

    @property
    def group_devices(self) -> tuple[int | None, ...]:
        """Devices one group of each level holds, innermost first: the product of the group
        sizes up to it (None: an open outermost level, which holds every device)."""
        out, devices = [], 1
        for x in self.links:
            devices = None if devices is None or x.group_size is None else devices * x.group_size
            out.append(devices)
        return tuple(out)

    def link(self, mesh: Mesh, axis: str) -> Link:
        """The link collectives over mesh axis ``axis`` run on: the one ``with_axis_links``
        named for it, else that of its level (`level_of`)."""
        _check_axis(mesh, axis)
        explicit = dict(self.axis_links)
        if axis in explicit:
            return self._link_named(explicit[axis])
        return self.links[self.level_of(mesh, axis)]

    def level_of(self, mesh: Mesh, axis: str) -> int:
        """Index in ``links`` of the innermost level whose group holds every device of mesh
        ``axis`` (ignores axis_links). The minor-most mesh axes (the last in mesh order) lie
        on neighbouring devices, so an axis spans its size times the sizes of the axes
        after it; the first level whose `group_devices` reach that span holds it, and an
        axis no group holds runs on the outermost level."""
        _check_axis(mesh, axis)
        span = 1
        for name, n in reversed(mesh.axes):
            span *= n
            if name == axis:
                break
        for i, devices in enumerate(self.group_devices[:-1]):
            if span <= devices:
                return i
        return len(self.links) - 1

    def intra_node_axes(self, mesh: Mesh) -> tuple[str, ...]:
        """Mesh axes that fit in one node, filled from the minor-most axis while the
        product of their sizes is at most ``devices_per_node`` (ignores axis_links)."""
        inside, size = [], 1
        for name, n in reversed(mesh.axes):
            if size * n > self.devices_per_node:
                break
            size *= n
            inside.append(name)
        return tuple(reversed(inside))

    def _link_named(self, name: str) -> Link:
        for x in self.links:
            if x.name == name:
                return x
        raise HardwareError(
            f"hardware {self.name!r} has no link named {name!r}; "
            f"its links are {[x.name for x in self.links]}."
        )


def _check_kinds(hw: Hardware) -> None:
    """The fields whose type the checks of figures do not cover: a name, mappings, links."""
    if not (isinstance(hw.name, str) and hw.name):
        raise HardwareError(f"a hardware spec needs a name, e.g. 'my GPU'; got {given(hw.name)}.")
    for what, example in (
        ("flops", "{'bfloat16': 1e15}"),
        ("sources", "{'flops.bfloat16': 'url'}"),
    ):
        if not isinstance(getattr(hw, what), Mapping):
            raise HardwareError(
                f"hardware {hw.name!r} has {what}={given(getattr(hw, what))}; give a dict, "
                f"e.g. {example}."
            )
    if isinstance(hw.links, Link | str) or not isinstance(hw.links, Iterable):
        raise HardwareError(
            f"hardware {hw.name!r} has links={given(hw.links)}; give a tuple of Link levels, "
            "innermost first, e.g. (Link('nvlink', 4.5e11, 1e-6, group_size=8),)."
        )
    if not isinstance(hw.fuses_per_reader, bool):
        raise HardwareError(
            f"hardware {hw.name!r} has fuses_per_reader={given(hw.fuses_per_reader)}; "
            "give True (a CPU compiler's fusion) or False (GPU and TPU)."
        )


def _check_mapping(hw: Hardware, method: str, mapping, example: str) -> None:
    if not isinstance(mapping, Mapping):
        raise HardwareError(
            f"{hw.name!r}.{method}({given(mapping)}): give a dict, e.g. {method}({example}); "
            f"the links are {[x.name for x in hw.links]}."
        )


def _check_axis(mesh: Mesh, axis: str) -> None:
    if axis not in mesh:
        raise MeshError(f"mesh axis {axis!r} is not in {mesh}; its axes are {list(mesh.names)}.")


def _flat_keys(link: Link, *, first: bool) -> dict[str, str]:
    """A level's figure keys -> the keys `Hardware.figures` and ``sources`` file them under."""
    return {
        k: "devices_per_node" if first and k == "group_size" else f"links.{link.name}.{k}"
        for k in link.figures()
    }


def _rate_curve(hw: Hardware) -> float | tuple[tuple[float, float], ...] | None:
    """``hw.transpose_bandwidth`` checked: None, a float, or (bytes, bytes/s) points sorted
    by size."""
    given = hw.transpose_bandwidth
    if given is None:
        return None
    if positive(given):
        return float(given)
    try:
        points = tuple(sorted((float(size), float(rate)) for size, rate in given))
    except (TypeError, ValueError):
        points = ()
    sizes = [size for size, _ in points]
    if (
        points
        and len(set(sizes)) == len(sizes)
        and all(map(positive, sizes + [r for _, r in points]))
    ):
        return points
    raise HardwareError(
        f"hardware {hw.name!r} has transpose_bandwidth={given!r}; give a positive number of "
        "bytes/s, measured points ((array bytes, bytes/s), ...) with distinct positive sizes, "
        "or None for the HBM bandwidth."
    )
