"""Answers to the exercises of notebooks/course_10_recomputation.ipynb: each ``# %% N.M``
section replaces the cell marked ``"exercise": "N.M"``."""

# %% 10.1
# Full recomputation keeps each block's input: [batch / devices, seq_len, d_model] in bfloat16.
def kept_by_blocks(cfg, devices):
    return cfg.n_layers * (cfg.batch // devices) * cfg.seq_len * cfg.d_model * 2

# %% 10.2
budget = rows["no recomputation"][0] // 3
max_flops = base_flops + 0.5 * (cost[full] - base_flops)
print(f"budget {budget / 2**20:.2f} MiB, at most {max_flops:.3g} flops")

# Selective recomputation: keep the matmuls against weights, redo attention's batched products.
my_policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable

# %% 10.3
own_schedule = [wb.BP("batch"), wb.MP("model")]
