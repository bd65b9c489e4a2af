"""Hardware specs the simulator prices a step on, and the collective cost formulas.

A `Hardware` holds one device's peak FLOP/s per dtype, its memory bandwidth and
capacity, and the interconnect *levels* between devices, each a `Link(name,
bandwidth, latency, topology)`: ``links[0]`` joins the devices of one node (TPU ICI
inside a slice, GPU NVLink), ``links[-1]`` joins nodes (TPU DCN, GPU InfiniBand).
Every figure of a preset names its source in ``sources``, quoted as written there.

**Beyond the roofline** (figures a spec may leave out; ``calibrate()`` measures them):
``op_overhead`` is the fixed time each kernel costs on top of its roofline (launch,
dispatch, synchronisation between kernels: a few microseconds on GPUs and CPUs), which
dominates programs of many tiny ops; ``transpose_bandwidth`` is what a layout-changing
copy (a transpose of the minor dimension) achieves, which on CPUs can be several times
below streaming bandwidth and falls as the array outgrows the caches (so it may be given
as measured ``(array bytes, bytes/s)`` points, interpolated by `copy_bandwidth`); a
`Link` may carry measured figures per collective kind (``kinds``) where one (bandwidth,
latency) pair does not describe every algorithm the runtime uses. Presets leave these at
their neutral values (0; the HBM bandwidth; the link's own figures): no vendor publishes
them as such.

**Fresh memory.** A runtime that allocates a step's buffers from the operating system
pays to touch them the first time (page faults, zeroing). XLA's CPU runtime allocates
each run's temporary buffer and its outputs with ``malloc``, and glibc maps any block
above its largest mmap threshold (32 MiB on 64-bit Linux) fresh each time; below it,
freed memory is reused. ``fresh_buffer_bytes`` is that threshold (None: the runtime
reuses its memory, as accelerator runtimes' pooling allocators do) and
``first_touch_bandwidth`` the bytes/s at which a device touches fresh memory (None: free);
`fresh_memory_time` prices a step's buffers with them.

**Combined all-reduces.** ``all_reduce_combine_bytes`` is the most a runtime packs into
one combined all-reduce (XLA's all-reduce combiner: 30 MiB by default, unbounded on CPU
up to 256 operands); the simulator prices a bucket as one all-reduce (one latency) and its
memory keeps a bucket's gradients live until it runs.

**Which link a mesh axis uses** (`Hardware.link`): an explicit mapping set with
``with_axis_links({"model": "nvlink"})`` wins; otherwise a node is filled from the
minor-most mesh axes (the last in mesh order) while their cumulative size fits
``devices_per_node``; those axes get ``links[0]``, every other axis ``links[-1]``.

**Link.bandwidth** is what one device pushes into a collective along one axis, in one
direction (its egress), in bytes/s. On a GPU that is the per-GPU NVLink or NIC figure
in one direction (NVIDIA quotes NVLink bidirectionally: 900 GB/s on H100 is 450 GB/s
each way). On a TPU torus axis with wraparound a device sends to both neighbours at
once, so it is the "bidi" per-link figure of "How to Scale Your Model" (HTSYM).

**Collective formulas** (bytes are per device, by the convention of
``core/layout/collectives.py``; n devices in the group; bw, lat of the link):

=================  ============================================  =====================
kind               time                                          bytes
=================  ============================================  =====================
all-gather         (n-1)/n * bytes/bw + (n-1) * lat              the gathered output
reduce-scatter     (n-1)/n * bytes/bw + (n-1) * lat              the input
all-reduce         2(n-1)/n * bytes/bw + 2(n-1) * lat            the array
all-to-all         switch: (n-1)/n * bytes/bw + (n-1) * lat      the (local) array
                   torus:  floor(n^2/4)/n * bytes/bw + (n-1)*lat
collective-permute bytes/bw + lat                                the array
=================  ============================================  =====================

The ring formulas are HTSYM's (https://jax-ml.github.io/scaling-book/sharding/ for
TPUs: "T = V / W_ici" for an AllGather of V bytes, AllReduce twice that;
https://jax-ml.github.io/scaling-book/gpus/ for GPUs: "bytes * (N - 1) / (N * GPU
egress bandwidth)") with an alpha-beta latency term per ring step. All-to-all on a
switched network sends (n-1)/n of the array directly (HTSYM GPUs: "B * (N - 1) /
(W * N^2)" for a global array of B = n * bytes); on a bidirectional torus ring each
device forwards floor(n^2/4) chunks of bytes/n (HTSYM sharding, AllToAll footnote:
"N^2/4 ... the per-device cost is bytes / 4" of the global array, i.e. n/4 * bytes).

**Several axes at once.** A group spanning axes on one link is one ring of n = the
product of their sizes. A group spanning links is priced hierarchically (the
standard two-level algorithm, e.g. HTSYM GPUs "Cross-node collectives", NCCL's
hierarchical all-reduce): levels sorted fastest first with sizes n_1, n_2, ...; level
j runs its own ring on bytes / (n_1 ... n_{j-1}) (all-gather: slowest level first on
the smallest pieces; reduce-scatter: fastest first; all-reduce: reduce-scatter up,
all-reduce on the slowest level, all-gather down), and the stages add up. All-to-all
runs one full-size stage per level; a permute pays the slowest link once. With
``hierarchical=False`` the group is one flat ring at the slowest bandwidth and the
largest latency (an upper bound). Several axes on one torus link are priced as one
ring; HTSYM notes a gather over k torus axes can use k times the links, so this is
conservative there.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import numbers
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import jax.numpy as jnp

from workbench.core.errors import MeshError, WorkbenchError
from workbench.core.layout.mesh import Mesh

#: XLA's default threshold of its all-reduce combiner (GPU, and the pass's own default).
XLA_COMBINE_BYTES = 30 * 2**20 + 7
_XLA_COMBINE = (
    "XLA's default all-reduce combiner threshold: "
    "https://github.com/openxla/xla/blob/main/xla/service/collective_utils.h "
    '"kDefaultAllReduceCombineThreshold = 30 * 1024 * 1024 + 7" (flag '
    "xla_gpu_all_reduce_combine_threshold_bytes)"
)
_XLA_COMBINE_TPU = _XLA_COMBINE + "; the TPU compiler's own threshold is not published"
#: XLA's CPU compiler combines all-reduces without a byte limit (256 operands at most).
XLA_CPU_COMBINE_BYTES = float(2**63 - 1)
_XLA_CPU_COMBINE = (
    "https://github.com/openxla/xla/blob/main/xla/service/cpu/cpu_compiler.cc: "
    '"kCombineBytes = std::numeric_limits<int64_t>::max()", '
    '"kCombineCount = 256" for CpuAllReduceCombiner'
)

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
TOPOLOGIES = ("switch", "torus")


class HardwareError(WorkbenchError, ValueError):
    """A hardware spec was described wrongly, or asked for something it does not have."""


@dataclass(frozen=True, slots=True)
class Link:
    """One interconnect level: per-device egress bandwidth (bytes/s, one direction),
    latency per collective step (s), and topology ("switch": any device reaches any
    other in one hop; "torus": neighbours only, as TPU ICI). ``kinds`` optionally holds
    measured ``(kind, bandwidth, latency)`` triples that replace the two figures for one
    collective kind (see `figures_for`)."""

    name: str
    bandwidth: float
    latency: float
    topology: str = "switch"
    kinds: tuple[tuple[str, float, float], ...] = ()

    def figures_for(self, kind: str) -> tuple[float, float]:
        """``(bandwidth, latency)`` collectives of ``kind`` get on this link."""
        for k, bandwidth, latency in self.kinds:
            if k == kind:
                return bandwidth, latency
        return self.bandwidth, self.latency

    def __post_init__(self):
        object.__setattr__(self, "kinds", tuple(tuple(k) for k in self.kinds))
        for entry in self.kinds:
            ok = (
                len(entry) == 3
                and entry[0] in KINDS
                and _positive(entry[1])
                and _finite_nonneg(entry[2])
            )
            if not ok:
                raise HardwareError(
                    f"link {self.name!r} has per-kind figures {entry!r}; give "
                    f"(kind, bandwidth bytes/s > 0, latency s >= 0) with kind one of {KINDS}."
                )
        if len({k for k, _, _ in self.kinds}) != len(self.kinds):
            raise HardwareError(f"link {self.name!r} lists a collective kind twice: {self.kinds}.")
        if not (self.name and isinstance(self.name, str)):
            raise HardwareError(f"a link needs a name, e.g. 'nvlink'; got {self.name!r}.")
        if not (_positive(self.bandwidth) and _finite_nonneg(self.latency)):
            raise HardwareError(
                f"link {self.name!r} has bandwidth {self.bandwidth!r} and latency "
                f"{self.latency!r}; bandwidth must be a positive number of bytes/s and "
                "latency a non-negative number of seconds."
            )
        if self.topology not in TOPOLOGIES:
            raise HardwareError(
                f"link {self.name!r} has topology {self.topology!r}; use one of {TOPOLOGIES}."
            )


@dataclass(frozen=True, slots=True)
class Hardware:
    """One device type and how devices connect (see the module docstring)."""

    name: str
    flops: dict[str, float]  # peak FLOP/s per dtype name ("bfloat16", "float32", "int8", ...)
    hbm_bandwidth: float  # bytes/s between the device and its memory
    memory_bytes: float  # memory capacity per device
    links: tuple[Link, ...]  # innermost first: links[0] inside a node, links[-1] between nodes
    devices_per_node: int  # devices joined by links[0]
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

    def __post_init__(self):
        flops = {dtype_name(k): v for k, v in dict(self.flops).items()}
        object.__setattr__(self, "sources", dict(self.sources))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "axis_links", tuple(tuple(p) for p in self.axis_links))
        if not flops or not all(_positive(v) for v in flops.values()):
            raise HardwareError(
                f"hardware {self.name!r} needs positive peak FLOP/s per dtype, e.g. "
                f"{{'bfloat16': 1e15}}; got {self.flops!r}."
            )
        object.__setattr__(self, "flops", {k: float(v) for k, v in flops.items()})
        for what in ("hbm_bandwidth", "memory_bytes"):
            if not _positive(getattr(self, what)):
                raise HardwareError(
                    f"hardware {self.name!r} has {what}={getattr(self, what)!r}; "
                    "it must be a positive number of bytes (per second)."
                )
        if not self.links or not all(isinstance(x, Link) for x in self.links):
            raise HardwareError(
                f"hardware {self.name!r} needs at least one Link, innermost first; "
                f"got {self.links!r}."
            )
        names = [x.name for x in self.links]
        if len(set(names)) != len(names):
            raise HardwareError(f"hardware {self.name!r} has duplicate link names {names}.")
        if not (isinstance(self.devices_per_node, int) and self.devices_per_node >= 1):
            raise HardwareError(
                f"hardware {self.name!r} has devices_per_node={self.devices_per_node!r}; "
                "it must be a positive integer."
            )
        for _, link_name in self.axis_links:
            self._link_named(link_name)
        if not _finite_nonneg(self.op_overhead):
            raise HardwareError(
                f"hardware {self.name!r} has op_overhead={self.op_overhead!r}; it must be a "
                "non-negative number of seconds per kernel (0 to ignore launch overhead)."
            )
        if not _positive(self.all_reduce_combine_bytes):
            raise HardwareError(
                f"hardware {self.name!r} has all_reduce_combine_bytes="
                f"{self.all_reduce_combine_bytes!r}; it must be a positive number of bytes "
                f"(XLA's default is {XLA_COMBINE_BYTES})."
            )
        object.__setattr__(self, "transpose_bandwidth", _rate_curve(self))
        for what in ("fresh_buffer_bytes", "first_touch_bandwidth"):
            value = getattr(self, what)
            if value is not None and not _positive(value):
                raise HardwareError(
                    f"hardware {self.name!r} has {what}={value!r}; give a positive number of "
                    "bytes (per second), or None where the runtime reuses its memory."
                )

    def __hash__(self):
        return hash(
            (
                self.name,
                tuple(sorted(self.flops.items())),
                self.links,
                self.axis_links,
                self.op_overhead,
                self.transpose_bandwidth,
                self.all_reduce_combine_bytes,
                self.fresh_buffer_bytes,
                self.first_touch_bandwidth,
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
        out["hbm_bandwidth"] = self.hbm_bandwidth
        out["memory_bytes"] = self.memory_bytes
        for x in self.links:
            out[f"links.{x.name}.bandwidth"] = x.bandwidth
            out[f"links.{x.name}.latency"] = x.latency
            for kind, bandwidth, latency in x.kinds:
                out[f"links.{x.name}.{kind}.bandwidth"] = bandwidth
                out[f"links.{x.name}.{kind}.latency"] = latency
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
        for candidate in _fallback_chain(name):
            if candidate in self.flops:
                return self.flops[candidate]
        raise HardwareError(
            f"hardware {self.name!r} has no peak FLOP/s for {name!r} nor any fallback "
            f"({', '.join(_fallback_chain(name)[1:])}); it lists {sorted(self.flops)}. "
            "Add the rate to `flops`."
        )

    # -- links --------------------------------------------------------------------------------
    def with_axis_links(self, mapping: Mapping[str, str]) -> Hardware:
        """A copy where the given mesh axes use the named links, e.g.
        ``H100.with_axis_links({"model": "nvlink", "batch": "infiniband"})``.
        Merges with earlier choices; the newer wins."""
        for axis, link_name in mapping.items():
            if not isinstance(axis, str):
                raise HardwareError(f"mesh axis names are strings; got {axis!r}.")
            self._link_named(link_name)
        merged = dict(self.axis_links) | dict(mapping)
        return dataclasses.replace(self, axis_links=tuple(sorted(merged.items())))

    def link(self, mesh: Mesh, axis: str) -> Link:
        """The link collectives over mesh axis ``axis`` run on (see the module docstring)."""
        if axis not in mesh:
            raise MeshError(
                f"mesh axis {axis!r} is not in {mesh}; its axes are {list(mesh.names)}."
            )
        explicit = dict(self.axis_links)
        if axis in explicit:
            return self._link_named(explicit[axis])
        if len(self.links) == 1 or axis in self.intra_node_axes(mesh):
            return self.links[0]
        return self.links[-1]

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


# -- dtypes -------------------------------------------------------------------------------------
# Where a dtype's peak rate comes from when a spec does not list it (before float32, bfloat16).
FALLBACKS: dict[str, tuple[str, ...]] = {
    "float32": ("bfloat16",),
    "float16": ("bfloat16",),
    "bfloat16": ("float16",),
    "int8": ("bfloat16",),
    "uint8": ("int8", "bfloat16"),
    "int4": ("int8", "bfloat16"),
    "uint4": ("int8", "bfloat16"),
}


def dtype_name(dtype) -> str:
    """``jnp.bfloat16``, ``np.dtype("float32")`` or ``"int8"`` -> its numpy name."""
    try:
        return jnp.dtype(dtype).name
    except TypeError as e:
        raise HardwareError(
            f"{dtype!r} is not a dtype; give a numpy/JAX dtype or its name, "
            "e.g. 'float32', 'bfloat16', 'int8'."
        ) from e


def _fallback_chain(name: str) -> list[str]:
    chain = [name]
    specific = FALLBACKS.get(name)
    if specific is None and name.startswith("float8"):
        specific = ("bfloat16", "float16")
    for c in (*(specific or ()), "float32", "bfloat16"):
        if c not in chain:
            chain.append(c)
    return chain


def _rate_curve(hw: Hardware) -> float | tuple[tuple[float, float], ...] | None:
    """``hw.transpose_bandwidth`` checked: None, a float, or (bytes, bytes/s) points sorted
    by size."""
    given = hw.transpose_bandwidth
    if given is None:
        return None
    if _positive(given):
        return float(given)
    try:
        points = tuple(sorted((float(size), float(rate)) for size, rate in given))
    except (TypeError, ValueError):
        points = ()
    sizes = [size for size, _ in points]
    if (
        points
        and len(set(sizes)) == len(sizes)
        and all(map(_positive, sizes + [r for _, r in points]))
    ):
        return points
    raise HardwareError(
        f"hardware {hw.name!r} has transpose_bandwidth={given!r}; give a positive number of "
        "bytes/s, measured points ((array bytes, bytes/s), ...) with distinct positive sizes, "
        "or None for the HBM bandwidth."
    )


def _finite_nonneg(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _positive(x) -> bool:
    return _finite_nonneg(x) and x > 0


# -- collective time ------------------------------------------------------------------------------
def all_gather_time(out_bytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-gather of ``out_bytes`` (the gathered output) over ``n`` devices."""
    return 0.0 if n <= 1 else (n - 1) / n * out_bytes / bandwidth + (n - 1) * latency


def reduce_scatter_time(in_bytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring reduce-scatter of ``in_bytes`` (the input, before scattering)."""
    return 0.0 if n <= 1 else (n - 1) / n * in_bytes / bandwidth + (n - 1) * latency


def all_reduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce (reduce-scatter then all-gather) of ``nbytes``."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def all_to_all_time(
    nbytes: float, n: int, bandwidth: float, latency: float, topology: str = "switch"
) -> float:
    """All-to-all of a local array of ``nbytes``: direct sends on a switch, forwarded
    around a bidirectional ring on a torus (see the module docstring)."""
    if n <= 1:
        return 0.0
    factor = (n - 1) / n if topology == "switch" else (n * n // 4) / n
    return factor * nbytes / bandwidth + (n - 1) * latency


def permute_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Collective-permute: every device sends ``nbytes`` to one peer."""
    return nbytes / bandwidth + latency


def _for_kind(link: Link, kind: str) -> Link:
    if not link.kinds:
        return link
    bandwidth, latency = link.figures_for(kind)
    return Link(link.name, bandwidth, latency, link.topology)


def collective_time(
    kind: str,
    nbytes: float,
    axes: Iterable[str],
    mesh: Mesh,
    hardware: Hardware,
    *,
    hierarchical: bool = True,
) -> float:
    """Seconds one collective takes on ``hardware``, over mesh ``axes`` (see module doc)."""
    if kind not in KINDS:
        raise HardwareError(f"unknown collective kind {kind!r}; use one of {KINDS}.")
    axes = tuple(axes)
    if not axes or nbytes <= 0:
        return 0.0
    if len(set(axes)) != len(axes):
        raise HardwareError(f"a collective runs over each mesh axis once; got axes {axes}.")
    # each link's figures for this kind of collective (its own, unless measured per kind)
    links = [_for_kind(hardware.link(mesh, a), kind) for a in axes]
    if kind == "collective-permute":
        slowest = min(links, key=lambda x: x.bandwidth)
        return permute_time(nbytes, slowest.bandwidth, max(x.latency for x in links))
    levels: dict[str, list] = {}  # link name -> [link, group size]
    for a, x in zip(axes, links):
        levels.setdefault(x.name, [x, 1])[1] *= mesh.axis_size(a)
    if not hierarchical and len(levels) > 1:
        flat = Link(
            "flat",
            min(x.bandwidth for x in links),
            max(x.latency for x in links),
            "torus" if any(x.topology == "torus" for x in links) else "switch",
        )
        levels = {"flat": [flat, math.prod(mesh.axis_size(a) for a in axes)]}
    total, done = 0.0, 1  # `done`: product of the sizes of the faster levels
    for x, n in sorted(levels.values(), key=lambda lv: -lv[0].bandwidth):
        if kind == "all-to-all":
            total += all_to_all_time(nbytes, n, x.bandwidth, x.latency, x.topology)
            continue
        stage = {
            "all-gather": all_gather_time,
            "reduce-scatter": reduce_scatter_time,
            "all-reduce": all_reduce_time,
        }[kind]
        total += stage(nbytes / done, n, x.bandwidth, x.latency)
        done *= n
    return total


# -- presets --------------------------------------------------------------------------------------
_HTSYM_TPU = "https://jax-ml.github.io/scaling-book/tpus/"
_HTSYM_SHARD = "https://jax-ml.github.io/scaling-book/sharding/"
_HTSYM_GPU = "https://jax-ml.github.io/scaling-book/gpus/"
_JAX_PRECISION = "https://docs.jax.dev/en/latest/201/precision.html"
_ICI_LATENCY = (
    f'{_HTSYM_SHARD}: "Each hop over an ICI link has some intrinsic overhead regardless '
    'of the data volume. This is typically around 1us."'
)
_DCN_LATENCY = (
    "assumed: 10 us per step, an order of magnitude for data-center networking "
    "(no vendor figure); replace with a calibrated value"
)
_NVLINK_LATENCY = (
    "assumed: 1 us per ring step, an order of magnitude; NCCL's tuning model "
    "(github.com/NVIDIA/nccl src/graph/tuning.cc, hwLat) puts NVLink ring steps at ~0.4-5.7 us "
    "depending on protocol"
)
_IB_LATENCY = (
    "assumed: 5 us per ring step, an order of magnitude; NCCL's tuning model "
    "(src/graph/tuning.cc, hwLat) puts network ring steps at ~0.9-6.6 us plus base latency"
)

TPU_V4 = Hardware(
    name="TPU v4",
    flops={"bfloat16": 275e12, "int8": 275e12},
    hbm_bandwidth=1.2e12,
    memory_bytes=32 * 2**30,
    links=(Link("ici", 9e10, 1e-6, "torus"), Link("dcn", 6.25e9, 1e-5)),
    devices_per_node=4096,
    sources={
        "flops.bfloat16": 'https://cloud.google.com/tpu/docs/v4: "Peak compute per chip (bf16) 275 TFLOPs"',
        "flops.int8": f'{_HTSYM_TPU}: TPU v4p "FLOPs/s/chip (int8) 2.75e14"',
        "hbm_bandwidth": 'https://cloud.google.com/tpu/docs/v4: "HBM2 capacity and bandwidth 32 GiB, 1200 GBps"',
        "memory_bytes": 'https://cloud.google.com/tpu/docs/v4: "HBM2 capacity and bandwidth 32 GiB, 1200 GBps"',
        "links.ici.bandwidth": f'{_HTSYM_TPU}: TPU v4p "ICI BW/link (bidi, bytes/s) 9e10" (one-way 4.5e10)',
        "links.ici.latency": _ICI_LATENCY,
        "links.dcn.bandwidth": f'{_HTSYM_TPU}: "DCN bandwidth is typically around 2.5e10 bytes / second per host", over 4 chips per host (host size 2x2x1)',
        "links.dcn.latency": _DCN_LATENCY,
        "devices_per_node": f'{_HTSYM_TPU}: "the maximum pod size (called a superpod) is 16x16x16 for TPU v4" (one ICI domain)',
        "all_reduce_combine_bytes": _XLA_COMBINE_TPU,
    },
    notes="No float32 rate: float32 dots run as one bfloat16 pass at JAX's default precision.",
)

TPU_V5E = Hardware(
    name="TPU v5e",
    flops={"bfloat16": 197e12, "int8": 393e12},
    hbm_bandwidth=819e9,
    memory_bytes=16e9,
    links=(Link("ici", 1e11, 1e-6, "torus"), Link("dcn", 3.125e9, 1e-5)),
    devices_per_node=256,
    sources={
        "flops.bfloat16": 'https://cloud.google.com/tpu/docs/v5e: "Peak compute per chip (bf16) 197 TFLOPs"',
        "flops.int8": 'https://cloud.google.com/tpu/docs/v5e: "Peak compute per chip (Int8) 393 TFLOPs"',
        "hbm_bandwidth": 'https://cloud.google.com/tpu/docs/v5e: "HBM2 capacity and bandwidth 16 GB, 819 GBps"',
        "memory_bytes": 'https://cloud.google.com/tpu/docs/v5e: "HBM2 capacity and bandwidth 16 GB, 819 GBps"',
        "links.ici.bandwidth": f'{_HTSYM_TPU}: TPU v5e "ICI BW/link (bidi, bytes/s) 1e11"; cloud.google.com/tpu/docs/v5e: "Interchip Interconnect BW 1600 Gbps" per chip over 4 links',
        "links.ici.latency": _ICI_LATENCY,
        "links.dcn.bandwidth": 'https://cloud.google.com/tpu/docs/v5e: "Data center network bandwidth per Pod 6.4 Tbps" over "TPU Pod size 256 chips" = 3.125e9 bytes/s per chip',
        "links.dcn.latency": _DCN_LATENCY,
        "devices_per_node": 'https://cloud.google.com/tpu/docs/v5e: "TPU Pod size 256 chips", "Interconnect topology 2D Torus"',
        "all_reduce_combine_bytes": _XLA_COMBINE_TPU,
    },
    notes="No float32 rate: float32 dots run as one bfloat16 pass at JAX's default precision.",
)

TPU_V5P = Hardware(
    name="TPU v5p",
    flops={"bfloat16": 459e12, "float8_e4m3fn": 459e12, "float8_e5m2": 459e12, "int8": 918e12},
    hbm_bandwidth=2765e9,
    memory_bytes=95 * 2**30,
    links=(Link("ici", 2e11, 1e-6, "torus"), Link("dcn", 6.25e9, 1e-5)),
    devices_per_node=6144,
    sources={
        "flops.bfloat16": 'https://cloud.google.com/tpu/docs/v5p: "Peak compute per chip (BF16) (TFLOPs) 459"',
        "flops.float8_e4m3fn": 'https://cloud.google.com/tpu/docs/v5p: "Peak compute per chip (FP8) (TFLOPs) 459"',
        "flops.float8_e5m2": 'https://cloud.google.com/tpu/docs/v5p: "Peak compute per chip (FP8) (TFLOPs) 459"',
        "flops.int8": f'{_HTSYM_TPU}: TPU v5p "FLOPs/s/chip (int8) 9.18e14"',
        "hbm_bandwidth": 'https://cloud.google.com/tpu/docs/v5p: "HBM bandwidth per chip (GBps) 2765"',
        "memory_bytes": 'https://cloud.google.com/tpu/docs/v5p: "HBM capacity per chip (GiB) 95"',
        "links.ici.bandwidth": f'{_HTSYM_TPU}: TPU v5p "ICI BW/link (bidi, bytes/s) 2e11"; cloud.google.com/tpu/docs/v5p: "Bidirectional inter-chip interconnect (ICI) bandwidth per chip (GBps) 1200" over 6 links',
        "links.ici.latency": _ICI_LATENCY,
        "links.dcn.bandwidth": 'https://cloud.google.com/tpu/docs/v5p: "Data center network (DCN) bandwidth per chip (Gbps) 50"',
        "links.dcn.latency": _DCN_LATENCY,
        "devices_per_node": 'https://cloud.google.com/tpu/docs/v5p: "Single slice training is supported for up to 6144 chips"',
        "all_reduce_combine_bytes": _XLA_COMBINE_TPU,
    },
    notes="No float32 rate: float32 dots run as one bfloat16 pass at JAX's default precision.",
)

_DENSE = "NVIDIA quotes it with sparsity; dense is half"
_TF32 = (
    f"TF32 tensor-core rate, used for float32 because JAX's default precision computes "
    f"float32 dots in TF32 on recent GPUs ({_JAX_PRECISION})"
)

A100 = Hardware(
    name="A100 80GB SXM",
    flops={
        "float64": 19.5e12,
        "float32": 156e12,
        "bfloat16": 312e12,
        "float16": 312e12,
        "int8": 624e12,
    },
    hbm_bandwidth=2039e9,
    memory_bytes=80e9,
    links=(Link("nvlink", 300e9, 1e-6), Link("infiniband", 25e9, 5e-6)),
    devices_per_node=8,
    sources={
        "flops.float64": 'https://www.nvidia.com/en-us/data-center/a100/ (datasheet): "FP64 Tensor Core 19.5 TFLOPS"',
        "flops.float32": f'https://www.nvidia.com/en-us/data-center/a100/: "TF32 Tensor Core 156 TFLOPS | 312 TFLOPS*"; {_TF32}',
        "flops.bfloat16": 'https://www.nvidia.com/en-us/data-center/a100/: "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*"',
        "flops.float16": 'https://www.nvidia.com/en-us/data-center/a100/: "FP16 Tensor Core 312 TFLOPS | 624 TFLOPS*"',
        "flops.int8": 'https://www.nvidia.com/en-us/data-center/a100/: "INT8 Tensor Core 624 TOPS | 1248 TOPS*"',
        "hbm_bandwidth": 'https://www.nvidia.com/en-us/data-center/a100/: A100 80GB SXM "GPU Memory Bandwidth 2,039 GB/s"',
        "memory_bytes": 'https://www.nvidia.com/en-us/data-center/a100/: "GPU Memory 80GB HBM2e"',
        "links.nvlink.bandwidth": f'https://www.nvidia.com/en-us/data-center/a100/: "NVIDIA NVLink: 600 GB/s" (both directions); {_HTSYM_GPU}: Ampere "Node GPU to GPU bandwidth (GB/s full-duplex) 300"',
        "links.nvlink.latency": _NVLINK_LATENCY,
        "links.infiniband.bandwidth": 'https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html: DGX A100 "8x Single-Port NVIDIA ConnectX-6 VPI 200Gb/s HDR InfiniBand", one per GPU = 25e9 bytes/s',
        "links.infiniband.latency": _IB_LATENCY,
        "devices_per_node": f'{_HTSYM_GPU}: Ampere "Node size (NVLink domain) 8"',
        "all_reduce_combine_bytes": _XLA_COMBINE,
    },
)

_H100_URL = "https://www.nvidia.com/en-us/data-center/h100/"
_H200_URL = "https://www.nvidia.com/en-us/data-center/h200/"
_CX7 = (
    f'{_HTSYM_GPU}: "each box ... is a single 8xH100 node with 8 GPUs, 8 400Gbps CX7 NICs '
    '(one per GPU)" = 50e9 bytes/s per GPU'
)


def _hopper(name: str, url: str, memory: float, hbm: float, mem_quote: str, bw_quote: str):
    return Hardware(
        name=name,
        flops={
            "float64": 67e12,
            "float32": 494.5e12,
            "bfloat16": 989.5e12,
            "float16": 989.5e12,
            "float8_e4m3fn": 1979e12,
            "float8_e5m2": 1979e12,
            "int8": 1979e12,
        },
        hbm_bandwidth=hbm,
        memory_bytes=memory,
        links=(Link("nvlink", 450e9, 1e-6), Link("infiniband", 50e9, 5e-6)),
        devices_per_node=8,
        sources={
            "flops.float64": f'{url} (SXM): "FP64 Tensor Core 67 teraFLOPS"',
            "flops.float32": f'{url}: "TF32 Tensor Core 989 teraFLOPS" ({_DENSE}); {_TF32}',
            "flops.bfloat16": f'{url}: "BFLOAT16 Tensor Core 1,979 teraFLOPS" ({_DENSE}); {_HTSYM_GPU}: "9.9e14"',
            "flops.float16": f'{url}: "FP16 Tensor Core 1,979 teraFLOPS" ({_DENSE})',
            "flops.float8_e4m3fn": f'{url}: "FP8 Tensor Core 3,958 teraFLOPS" ({_DENSE})',
            "flops.float8_e5m2": f'{url}: "FP8 Tensor Core 3,958 teraFLOPS" ({_DENSE})',
            "flops.int8": f'{url}: "INT8 Tensor Core 3,958 TOPS" ({_DENSE})',
            "hbm_bandwidth": f"{url}: {bw_quote}",
            "memory_bytes": f"{url}: {mem_quote}",
            "links.nvlink.bandwidth": f'{url}: "NVIDIA NVLink: 900GB/s" (both directions); {_HTSYM_GPU}: "H100s have about 450GB/s of egress bandwidth each in the NVLink domain"',
            "links.nvlink.latency": _NVLINK_LATENCY,
            "links.infiniband.bandwidth": _CX7,
            "links.infiniband.latency": _IB_LATENCY,
            "devices_per_node": f'{_HTSYM_GPU}: Hopper "Node size (NVLink domain) 8"',
            "all_reduce_combine_bytes": _XLA_COMBINE,
        },
    )


H100 = _hopper(
    "H100 SXM", _H100_URL, 80e9, 3.35e12, '"GPU Memory 80GB"', '"GPU Memory Bandwidth 3.35TB/s"'
)
H200 = _hopper(
    "H200 SXM", _H200_URL, 141e9, 4.8e12, '"GPU Memory 141GB"', '"GPU Memory Bandwidth 4.8TB/s"'
)

_PLACEHOLDER = "placeholder: a modest generic figure for a small CPU host; replace it with workbench.core.hardware.calibrate.calibrate()"
CPU = Hardware(
    name="CPU (placeholder)",
    flops={"float32": 5e10, "float64": 2.5e10},
    hbm_bandwidth=1e10,
    memory_bytes=8e9,
    links=(Link("host", 5e9, 1e-5),),
    devices_per_node=1024,
    all_reduce_combine_bytes=XLA_CPU_COMBINE_BYTES,
    fuses_per_reader=True,
    sources={
        "flops.float32": _PLACEHOLDER,
        "flops.float64": _PLACEHOLDER,
        "hbm_bandwidth": _PLACEHOLDER,
        "memory_bytes": _PLACEHOLDER,
        "links.host.bandwidth": _PLACEHOLDER + " (virtual devices exchange data in host memory)",
        "links.host.latency": _PLACEHOLDER,
        "devices_per_node": "all virtual CPU devices live in one process",
        "all_reduce_combine_bytes": _XLA_CPU_COMBINE,
    },
    notes="Placeholder figures, not measured: run calibrate() to replace them.",
)

PRESETS = {h.name: h for h in (TPU_V4, TPU_V5E, TPU_V5P, A100, H100, H200, CPU)}
