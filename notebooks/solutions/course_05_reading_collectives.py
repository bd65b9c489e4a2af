"""Answers to the exercises of notebooks/course_05_reading_collectives.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 5.1
# Your turn: the bytes per device of the array each device holds when it all-reduces
def attn_allreduce_bytes(batch, seq, d_model, itemsize, mesh):
    # the array is whole over "model" (a pending sum of full width); only "batch" splits it
    return batch // mesh.axis_size("batch") * seq * d_model * itemsize

# %% 5.2
# Your turn: count the arrays moved per step, from the records
def xla_runs(hlo, kind, axes):
    # one record per array; `count` is how many times the loops around it run it
    return sum(h.count for h in hlo if h.kind == kind and h.axes == tuple(axes))

# %% 5.3
# Your turn: attn_allreduce_bytes(...) with own's batch, sequence, width and dtype
tokens = own.value("batch/input_ids")  # [batch, seq]
embedding = own.value("params/transformer/wte/embedding")  # [vocab, d_model]
own_bytes = attn_allreduce_bytes(*tokens.shape, embedding.shape[1], embedding.dtype.itemsize, mesh)
