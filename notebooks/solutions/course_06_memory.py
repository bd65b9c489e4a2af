"""Answers to the exercises of notebooks/course_06_memory.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 6.1
# Your turn: a list of tactics for `mesh` (try [wb.BP("batch"), wb.MP("model")] first: what is largest?)
# activations are the largest part: MP and SP divide them, ZeRO-3 the model state left
my_schedule = [wb.BP("batch"), wb.MP("model"), wb.SP("model"), wb.Z3("batch")]

# %% 6.2
# Your turn: the model state per device, from the config and the tensor-parallel degree t
def model_state_bytes(cfg, t):
    D, H, K, F, L = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_ff, cfg.n_layers
    split = L * (4 * D * H * K + 2 * D * F)  # wq, wk, wv, wo and w_in, w_out in every layer
    return 16 * (split / t + (cfg.n_params - split))  # the embeddings and layer norms stay whole

# %% 6.3
# Your turn: a list of tactics for `mesh` that fits own_device
own_schedule = [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")]
