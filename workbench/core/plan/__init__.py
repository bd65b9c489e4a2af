"""The execution plan: per-op layouts, fetches and the collectives they need."""
