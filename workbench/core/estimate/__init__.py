"""The simulator: compute, communication, memory and overlap of one step per device."""
