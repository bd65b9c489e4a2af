"""Answers to the exercises of notebooks/course_02_megatron.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 2.1
# Tile the hidden dimension (the last dim) of every w_in [D, F]: GeLU then runs on each
# device's slice, w_out follows on its rows, and its product is a pending sum.
mlp_only = [wb.Tile("params/**/mlp/w_in", -1, "model")]


# %% 2.2
# Each forward all-reduce makes whole one activation [batch, seq_len, d_model].
def fwd_allreduce_bytes(batch, seq_len, d_model, dtype_bytes):
    return batch * seq_len * d_model * dtype_bytes


# %% 2.3
# GPT-2's c_fc kernel is stored [d_ff, d_model] (its shape above): its hidden dim is dim 0.
own_mlp = [wb.Tile("params/**/mlp/c_fc/kernel", 0, "model")]
