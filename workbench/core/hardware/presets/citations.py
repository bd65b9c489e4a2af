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
