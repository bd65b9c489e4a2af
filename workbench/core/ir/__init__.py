"""The program as the engine reads it: capture, the Program graph, phases and selectors."""
