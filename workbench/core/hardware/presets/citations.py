"""Sources that several vendors' presets cite: How to Scale Your Model (HTSYM), JAX's
precision notes, XLA's all-reduce combiner, and the assumed latencies no vendor publishes."""

HTSYM_TPU = "https://jax-ml.github.io/scaling-book/tpus/"
HTSYM_SHARD = "https://jax-ml.github.io/scaling-book/sharding/"
HTSYM_GPU = "https://jax-ml.github.io/scaling-book/gpus/"
JAX_PRECISION = "https://docs.jax.dev/en/latest/201/precision.html"

XLA_COMBINE = (
    "XLA's default all-reduce combiner threshold: "
    "https://github.com/openxla/xla/blob/main/xla/service/collective_utils.h "
    '"kDefaultAllReduceCombineThreshold = 30 * 1024 * 1024 + 7" (flag '
    "xla_gpu_all_reduce_combine_threshold_bytes)"
)
XLA_COMBINE_TPU = XLA_COMBINE + "; the TPU compiler's own threshold is not published"
XLA_CPU_COMBINE = (
    "https://github.com/openxla/xla/blob/main/xla/service/cpu/cpu_compiler.cc: "
    '"kCombineBytes = std::numeric_limits<int64_t>::max()", '
    '"kCombineCount = 256" for CpuAllReduceCombiner'
)

ICI_LATENCY = (
    f'{HTSYM_SHARD}: "Each hop over an ICI link has some intrinsic overhead regardless '
    'of the data volume. This is typically around 1us."'
)
DCN_LATENCY = (
    "assumed: 10 us per step, an order of magnitude for data-center networking "
    "(no vendor figure); replace with a calibrated value"
)
NVLINK_LATENCY = (
    "assumed: 1 us per ring step, an order of magnitude; NCCL's tuning model "
    "(github.com/NVIDIA/nccl src/graph/tuning.cc, hwLat) puts NVLink ring steps at ~0.4-5.7 us "
    "depending on protocol"
)
IB_LATENCY = (
    "assumed: 5 us per ring step, an order of magnitude; NCCL's tuning model "
    "(src/graph/tuning.cc, hwLat) puts network ring steps at ~0.9-6.6 us plus base latency"
)

MAMF = (
    "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md, "
    '"Maximum Achievable '
    'Matmul FLOPS comparison table" (mamf-finder.py: the best BF16 matmul over a scan of '
    "large shapes, no sparsity)"
)

# Bus bandwidth NCCL's collectives reach, measured (nccl-tests' busbw: the per-link rate of
# the ring formula the presets price with).
NCCL_NETWORK = "https://github.com/stas00/ml-engineering/blob/master/network/README.md"
NCCL_A100_NVLINK = (
    f"{NCCL_NETWORK}: nccl-tests all_reduce_perf on 8 A100s, 16 GiB: "
    '"17_179_869_184  127997  134.22  234.89" ("| A100, NVLink 3 | 234.89GBps | 300 | 78% |"); '
    "a ring all-reduce is a reduce-scatter then an all-gather, each at that bus bandwidth"
)
NCCL_NVLINK4 = (
    f"{NCCL_NETWORK}: 8 H200s over NVLink 4 (the H100's NVLink and NVSwitch), 16 GiB: "
    '"all-reduce" 480.0GBps (NVLS, NCCL\'s default on NVSwitch), all-gather 361.4GBps, '
    'reduce-scatter 362.9GBps; "an H100 intra-node NVLink 4.0 all-reduce benchmark reported '
    '480GBps for a 4GiB payload"'
)
NCCL_HDR = (
    "https://github.com/NVIDIA/nccl-tests/issues/160 (an NCCL maintainer): on rings across "
    'nodes "20GB/s per NIC which is not 24 (what we see ourselves in general on perfect '
    'setups)" for 200 Gb/s HDR'
)
NCCL_NDR = (
    "https://github.com/NVIDIA/nccl-tests/issues/290 (an NCCL maintainer): "
    '"For NDR @ 400Gbps you should see 46-48GB/s per NIC" (47e9, the middle)'
)

FLASH2 = (
    'https://arxiv.org/abs/2307.08691 (FlashAttention-2, Dao 2023): "reaching 50-73% of the '
    'theoretical maximum FLOPs/s on A100" (the best, 73%)'
)
FLASH3 = (
    'https://arxiv.org/abs/2407.08608 (FlashAttention-3, Shah et al. 2024): "speedup on H100 '
    'GPUs by 1.5-2.0x with FP16 reaching up to 740 TFLOPs/s (75% utilization)" (740 of 989.5)'
)

MATMUL_GUIDE = (
    "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/"
    'index.html: "GPUs implement GEMMs by partitioning the output matrix into tiles, which '
    'are then assigned to thread blocks"; cuBLAS chooses among tiles of 256x128 and 128x256 '
    "(the most efficient) down to 64x64, larger tiles reusing more data; tile quantization "
    "pads a dim to its tiles and wave quantization leaves part of the last wave of tiles "
    "over the SMs idle"
)
TPU_TILES = (
    'https://cloud.google.com/tpu/docs/performance-guide: "Each TPU core uses '
    'two-dimensional 8 X 128 vector registers for processing matrix multiplications"; where '
    "a tensor does not fill them XLA pads it; the MXU contracts in steps of its 128x128 "
    f"systolic array ({HTSYM_TPU})"
)
