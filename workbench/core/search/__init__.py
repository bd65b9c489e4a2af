"""Auto: tree search over the decisions a tactic leaves open."""
