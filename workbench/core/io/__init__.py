"""Exports and imports: structural keys for values (``structure``), a session's plan as the
PartitionSpec trees and logical-axis rules a training loop plugs in (``specs``), and plans a
user already has read back into a schedule (``imports``)."""
