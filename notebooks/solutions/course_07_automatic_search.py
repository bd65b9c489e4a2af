"""Answers to the exercises of notebooks/course_07_automatic_search.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 7.1
# Try: drop memory_limit, and read what the check says.
fitted = wb.Session(program8, data_mesh, [wb.Auto("data", memory_limit=LIMIT, budget=40, seconds=30)])

# %% 7.2
# Try: wb.Auto(("batch", "model"), ...) alone, without BP, and read the check.
hybrid = wb.Session(program8, mesh_2d, [wb.BP("batch"), wb.Auto("model", budget=40, seconds=30)])

# %% 7.3
own_hybrid = wb.Session(own, mesh_2d, [wb.BP("batch"), wb.Auto("model", budget=20, seconds=15, seed=0)])
