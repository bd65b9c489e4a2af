"""Anatomy: what a training step is made of, read from its structure alone."""
