"""NVIDIA GPU presets (A100, H100, H200 SXM): a GPU, the NVLink domain of its 8-GPU node and
the InfiniBand network between nodes, every figure quoted from its source."""

from workbench.core.hardware.levels import Link
from workbench.core.hardware.presets.citations import (
    FLASH2,
    FLASH3,
    HTSYM_GPU,
    IB_LATENCY,
    JAX_PRECISION,
    MAMF,
    MATMUL_GUIDE,
    NCCL_A100_NVLINK,
    NCCL_HDR,
    NCCL_NDR,
    NCCL_NVLINK4,
    NVLINK_LATENCY,
    XLA_COMBINE,
)
from workbench.core.hardware.spec import Hardware
from workbench.core.hardware.tiles import Tiles

_DENSE = "NVIDIA quotes it with sparsity; dense is half"
_TF32 = (
    f"TF32 tensor-core rate, used for float32 because JAX's default precision computes "
    f"float32 dots in TF32 on recent GPUs ({JAX_PRECISION})"
)
_A100_URL = "https://www.nvidia.com/en-us/data-center/a100/"
_H100_URL = "https://www.nvidia.com/en-us/data-center/h100/"
_H200_URL = "https://www.nvidia.com/en-us/data-center/h200/"
_CX7 = (
    f'{HTSYM_GPU}: "each box ... is a single 8xH100 node with 8 GPUs, 8 400Gbps CX7 NICs '
    '(one per GPU)" = 50e9 bytes/s per GPU'
)

_RINGS = ("all-reduce", "all-gather", "reduce-scatter")
# cuBLAS's largest tiles (no padding of the contraction), one per SM at a time
_SHAPES = ((256, 128, 1), (128, 256, 1), (128, 128, 1))
_AMPERE = "https://developer.nvidia.com/blog/nvidia-ampere-architecture-in-depth/"
_HOPPER = "https://developer.nvidia.com/blog/nvidia-hopper-architecture-in-depth/"


def _tiles(units: int, sm_quote: str) -> tuple[Tiles, dict[str, str]]:
    keys = [f"{m}x{n}x{k}" for m, n, k in _SHAPES]
    sources = {f"matmul_tiles.{key}": MATMUL_GUIDE for key in keys}
    return Tiles(_SHAPES, units), sources | {"matmul_tiles.units": sm_quote}


_A100_TILES = _tiles(108, f'{_AMPERE}: the A100 "is composed of ... 108 SMs"')
_HOPPER_TILES = _tiles(132, f'{_HOPPER}: "The H100 SXM5 GPU has 132 SMs"')


def _measured(bandwidth: float, all_reduce: float, all_gather: float, reduce_scatter: float):
    """Per-kind shares of a link's ``bandwidth``: the bus bandwidth NCCL's ring collectives
    reach, measured (all-to-all and collective-permute keep the link's figure)."""
    return tuple(
        (k, x / bandwidth) for k, x in zip(_RINGS, (all_reduce, all_gather, reduce_scatter))
    )


def _measured_sources(quote: str) -> dict[str, str]:
    return {f"{kind}.efficiency": quote for kind in _RINGS}


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
    matmul_efficiency={"bfloat16": 267.9e12 / 312e12},
    attention_efficiency={"bfloat16": 0.73},
    links=(
        Link(
            "nvlink",
            300e9,
            1e-6,
            efficiency=_measured(300e9, 234.89e9, 234.89e9, 234.89e9),
            group_size=8,
            sources={
                "bandwidth": f'{_A100_URL}: "NVIDIA NVLink: 600 GB/s" (both directions); {HTSYM_GPU}: Ampere "Node GPU to GPU bandwidth (GB/s full-duplex) 300"',
                "latency": NVLINK_LATENCY,
                **_measured_sources(NCCL_A100_NVLINK),
                "group_size": f'{HTSYM_GPU}: Ampere "Node size (NVLink domain) 8"',
            },
        ),
        Link(
            "infiniband",
            25e9,
            5e-6,
            efficiency=_measured(25e9, 24e9, 24e9, 24e9),
            sources={
                "bandwidth": 'https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html: DGX A100 "8x Single-Port NVIDIA ConnectX-6 VPI 200Gb/s HDR InfiniBand", one per GPU = 25e9 bytes/s',
                "latency": IB_LATENCY,
                **_measured_sources(NCCL_HDR),
            },
        ),
    ),
    sources={
        "flops.float64": f'{_A100_URL} (datasheet): "FP64 Tensor Core 19.5 TFLOPS"',
        "flops.float32": f'{_A100_URL}: "TF32 Tensor Core 156 TFLOPS | 312 TFLOPS*"; {_TF32}',
        "flops.bfloat16": f'{_A100_URL}: "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*"',
        "flops.float16": f'{_A100_URL}: "FP16 Tensor Core 312 TFLOPS | 624 TFLOPS*"',
        "flops.int8": f'{_A100_URL}: "INT8 Tensor Core 624 TOPS | 1248 TOPS*"',
        "matmul_efficiency.bfloat16": f'{MAMF}: "NVIDIA A100 SXM | 267.9 | 312 | 85.9% | '
        '6912x16384x2048 | CUDA-12.1"; float16 and TF32 fall back to it',
        "attention_efficiency.bfloat16": f"{FLASH2}; float16 falls back to it",
        "hbm_bandwidth": f'{_A100_URL}: A100 80GB SXM "GPU Memory Bandwidth 2,039 GB/s"',
        "memory_bytes": f'{_A100_URL}: "GPU Memory 80GB HBM2e"',
        "all_reduce_combine_bytes": XLA_COMBINE,
        **_A100_TILES[1],
    },
    matmul_tiles=_A100_TILES[0],
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
        matmul_efficiency={"bfloat16": 792.1e12 / 989.5e12},
        attention_efficiency={"bfloat16": 740e12 / 989.5e12},
        links=(
            Link(
                "nvlink",
                450e9,
                1e-6,
                efficiency=_measured(450e9, 480.0e9, 361.4e9, 362.9e9),
                group_size=8,
                sources={
                    "bandwidth": f'{url}: "NVIDIA NVLink: 900GB/s" (both directions); {HTSYM_GPU}: "H100s have about 450GB/s of egress bandwidth each in the NVLink domain"',
                    "latency": NVLINK_LATENCY,
                    **_measured_sources(NCCL_NVLINK4),
                    "group_size": f'{HTSYM_GPU}: Hopper "Node size (NVLink domain) 8"',
                },
            ),
            Link(
                "infiniband",
                50e9,
                5e-6,
                efficiency=_measured(50e9, 47e9, 47e9, 47e9),
                sources={
                    "bandwidth": _CX7,
                    "latency": IB_LATENCY,
                    **_measured_sources(NCCL_NDR),
                },
            ),
        ),
        sources={
            "flops.float64": f'{url} (SXM): "FP64 Tensor Core 67 teraFLOPS"',
            "flops.float32": f'{url}: "TF32 Tensor Core 989 teraFLOPS" ({_DENSE}); {_TF32}',
            "flops.bfloat16": f'{url}: "BFLOAT16 Tensor Core 1,979 teraFLOPS" ({_DENSE}); {HTSYM_GPU}: "9.9e14"',
            "flops.float16": f'{url}: "FP16 Tensor Core 1,979 teraFLOPS" ({_DENSE})',
            "flops.float8_e4m3fn": f'{url}: "FP8 Tensor Core 3,958 teraFLOPS" ({_DENSE})',
            "flops.float8_e5m2": f'{url}: "FP8 Tensor Core 3,958 teraFLOPS" ({_DENSE})',
            "flops.int8": f'{url}: "INT8 Tensor Core 3,958 TOPS" ({_DENSE})',
            "matmul_efficiency.bfloat16": f'{MAMF}: "NVIDIA H100 SXM | 792.1 | 989 | 80.1% | '
            '6144x17920x2816 | CUDA-12.1" (the H200 is the same chip); float16, TF32 and '
            "float8 fall back to it",
            "attention_efficiency.bfloat16": f"{FLASH3}; float16 falls back to it",
            "hbm_bandwidth": f"{url}: {bw_quote}",
            "memory_bytes": f"{url}: {mem_quote}",
            "all_reduce_combine_bytes": XLA_COMBINE,
            **_HOPPER_TILES[1],
        },
        matmul_tiles=_HOPPER_TILES[0],
    )


H100 = _hopper(
    "H100 SXM", _H100_URL, 80e9, 3.35e12, '"GPU Memory 80GB"', '"GPU Memory Bandwidth 3.35TB/s"'
)
H200 = _hopper(
    "H200 SXM", _H200_URL, 141e9, 4.8e12, '"GPU Memory 141GB"', '"GPU Memory Bandwidth 4.8TB/s"'
)
