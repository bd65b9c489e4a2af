"""Layouts: the mesh, a value's sharding, the session state, collectives and redistributions."""
