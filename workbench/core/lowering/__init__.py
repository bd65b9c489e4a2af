"""From a plan to runnable JAX (explicit shard_map, constrained jit), run and checked."""
