"""A plain Flower app: the baseline of ``fedstream bench deployment`` (no fedstream code)."""
