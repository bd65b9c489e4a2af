"""Propagation: tactics, the per-axis worklist to a fixed point, and its explanations."""
