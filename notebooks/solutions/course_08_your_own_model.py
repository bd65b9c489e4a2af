"""Answers to the exercises of notebooks/course_08_your_own_model.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 8.1
# Try: change a dim, or leave out a split parameter, and read what the check says.
mp_dims = {
    "attn/query/kernel/value": 1,
    "attn/key/kernel/value": 1,
    "attn/value/kernel/value": 1,
    "attn/out/kernel/value": 0,
    "linear1/kernel/value": 1,
    "linear1/bias/value": 0,
    "linear2/kernel/value": 0,
}

# %% 8.2
# Try: dim=0, or put the Role after MP, and read what the check says.
vocab_parallel = wb.Session(program, mesh, [
    wb.Role("model/lm_head/kernel/value", "hidden", dim=1),
    wb.MP("model"),
])

# %% 8.3
# Try: what would the NNX answer's dims be here? Try them.
gpt2_dims = {
    "attn/c_proj/kernel": 1,
    "mlp/c_fc/kernel": 0,
    "mlp/c_fc/bias": 0,
    "mlp/c_proj/kernel": 1,
}
