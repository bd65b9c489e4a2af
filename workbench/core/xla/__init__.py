"""Reading what XLA compiles: collectives in HLO, and cross-checks against the plan."""
