"""Google TPU presets (v4, v5e, v5p): a chip, its ICI torus slice and the data-center network
between slices, every figure quoted from its source."""

from workbench.core.hardware.levels import Link
from workbench.core.hardware.presets.citations import (
    DCN_LATENCY,
    HTSYM_TPU,
    ICI_LATENCY,
    TPU_TILES,
    XLA_COMBINE_TPU,
)
from workbench.core.hardware.spec import Hardware
from workbench.core.hardware.tiles import Tiles

# the matrix unit's tiles: 8 rows by 128 lanes of a result, its contraction in steps of 128
# (either of the result's dims may be laid out on the lanes: XLA picks the layout)
_TILES = Tiles(((8, 128, 128), (128, 8, 128)))
_TILE_SOURCES = {f"matmul_tiles.{key}": TPU_TILES for key in ("8x128x128", "128x8x128")}

_V4 = "https://cloud.google.com/tpu/docs/v4"
_V5E = "https://cloud.google.com/tpu/docs/v5e"
_V5P = "https://cloud.google.com/tpu/docs/v5p"
_BF16_PASS = "No float32 rate: float32 dots run as one bfloat16 pass at JAX's default precision."

TPU_V4 = Hardware(
    name="TPU v4",
    flops={"bfloat16": 275e12, "int8": 275e12},
    hbm_bandwidth=1.2e12,
    memory_bytes=32 * 2**30,
    links=(
        Link(
            "ici",
            9e10,
            1e-6,
            "torus",
            group_size=4096,
            wraps_at=4,
            sources={
                "wraps_at": f'{HTSYM_TPU}: "Any multiple of a full cube (e.g. 4x4x4 or 4x4x8) will have wraparounds provided by the optical switches"',
                "bandwidth": f'{HTSYM_TPU}: TPU v4p "ICI BW/link (bidi, bytes/s) 9e10" (one-way 4.5e10)',
                "latency": ICI_LATENCY,
                "group_size": f'{HTSYM_TPU}: "the maximum pod size (called a superpod) is 16x16x16 for TPU v4" (one ICI domain)',
            },
        ),
        Link(
            "dcn",
            6.25e9,
            1e-5,
            sources={
                "bandwidth": f'{HTSYM_TPU}: "DCN bandwidth is typically around 2.5e10 bytes / second per host", over 4 chips per host (host size 2x2x1)',
                "latency": DCN_LATENCY,
            },
        ),
    ),
    sources={
        "flops.bfloat16": f'{_V4}: "Peak compute per chip (bf16) 275 TFLOPs"',
        "flops.int8": f'{HTSYM_TPU}: TPU v4p "FLOPs/s/chip (int8) 2.75e14"',
        "hbm_bandwidth": f'{_V4}: "HBM2 capacity and bandwidth 32 GiB, 1200 GBps"',
        "memory_bytes": f'{_V4}: "HBM2 capacity and bandwidth 32 GiB, 1200 GBps"',
        "all_reduce_combine_bytes": XLA_COMBINE_TPU,
        **_TILE_SOURCES,
    },
    notes=_BF16_PASS,
    matmul_tiles=_TILES,
)

TPU_V5E = Hardware(
    name="TPU v5e",
    flops={"bfloat16": 197e12, "int8": 393e12},
    hbm_bandwidth=819e9,
    memory_bytes=16e9,
    links=(
        Link(
            "ici",
            1e11,
            1e-6,
            "torus",
            group_size=256,
            wraps_at=16,
            sources={
                "wraps_at": f'{HTSYM_TPU}: "A TPU v5e 8x16 _will_ have a wraparound on the longer axis"; HTSYM sharding: "TPU v5e only has a wraparound connection when one axis has size 16"',
                "bandwidth": f'{HTSYM_TPU}: TPU v5e "ICI BW/link (bidi, bytes/s) 1e11"; cloud.google.com/tpu/docs/v5e: "Interchip Interconnect BW 1600 Gbps" per chip over 4 links',
                "latency": ICI_LATENCY,
                "group_size": f'{_V5E}: "TPU Pod size 256 chips", "Interconnect topology 2D Torus"',
            },
        ),
        Link(
            "dcn",
            3.125e9,
            1e-5,
            sources={
                "bandwidth": f'{_V5E}: "Data center network bandwidth per Pod 6.4 Tbps" over "TPU Pod size 256 chips" = 3.125e9 bytes/s per chip',
                "latency": DCN_LATENCY,
            },
        ),
    ),
    sources={
        "flops.bfloat16": f'{_V5E}: "Peak compute per chip (bf16) 197 TFLOPs"',
        "flops.int8": f'{_V5E}: "Peak compute per chip (Int8) 393 TFLOPs"',
        "hbm_bandwidth": f'{_V5E}: "HBM2 capacity and bandwidth 16 GB, 819 GBps"',
        "memory_bytes": f'{_V5E}: "HBM2 capacity and bandwidth 16 GB, 819 GBps"',
        "all_reduce_combine_bytes": XLA_COMBINE_TPU,
        **_TILE_SOURCES,
    },
    notes=_BF16_PASS,
    matmul_tiles=_TILES,
)

TPU_V5P = Hardware(
    name="TPU v5p",
    flops={"bfloat16": 459e12, "float8_e4m3fn": 459e12, "float8_e5m2": 459e12, "int8": 918e12},
    hbm_bandwidth=2765e9,
    memory_bytes=95 * 2**30,
    links=(
        Link(
            "ici",
            2e11,
            1e-6,
            "torus",
            group_size=6144,
            wraps_at=4,
            sources={
                "wraps_at": f'{HTSYM_TPU}: "Any multiple of a full cube (e.g. 4x4x4 or 4x4x8) will have wraparounds provided by the optical switches"',
                "bandwidth": f'{HTSYM_TPU}: TPU v5p "ICI BW/link (bidi, bytes/s) 2e11"; cloud.google.com/tpu/docs/v5p: "Bidirectional inter-chip interconnect (ICI) bandwidth per chip (GBps) 1200" over 6 links',
                "latency": ICI_LATENCY,
                "group_size": f'{_V5P}: "Single slice training is supported for up to 6144 chips"',
            },
        ),
        Link(
            "dcn",
            6.25e9,
            1e-5,
            sources={
                "bandwidth": f'{_V5P}: "Data center network (DCN) bandwidth per chip (Gbps) 50"',
                "latency": DCN_LATENCY,
            },
        ),
    ),
    sources={
        "flops.bfloat16": f'{_V5P}: "Peak compute per chip (BF16) (TFLOPs) 459"',
        "flops.float8_e4m3fn": f'{_V5P}: "Peak compute per chip (FP8) (TFLOPs) 459"',
        "flops.float8_e5m2": f'{_V5P}: "Peak compute per chip (FP8) (TFLOPs) 459"',
        "flops.int8": f'{HTSYM_TPU}: TPU v5p "FLOPs/s/chip (int8) 9.18e14"',
        "hbm_bandwidth": f'{_V5P}: "HBM bandwidth per chip (GBps) 2765"',
        "memory_bytes": f'{_V5P}: "HBM capacity per chip (GiB) 95"',
        "all_reduce_combine_bytes": XLA_COMBINE_TPU,
        **_TILE_SOURCES,
    },
    notes=_BF16_PASS,
    matmul_tiles=_TILES,
)
