"""Answers to the exercises of notebooks/course_04_2d_mesh.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 4.1
# Data parallel on `batch`, Megatron on `model`, and ZeRO-3 on `batch`: each piece Megatron
# leaves on a column of the mesh is stored once over that column's 2 devices.
schedule_2d = [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")]

# %% 4.2
# Megatron's all-reduces run in every layer, on the critical path: they go inside the node.
links = {"model": "nvlink", "batch": "infiniband"}

# %% 4.3
# The same schedule: the tactics find the batch, the heads and the hidden dims from the anatomy.
own_2d = [wb.BP("batch"), wb.MP("model"), wb.Z3("batch")]
