"""A do-nothing Flower app: the floor of ``fedstream bench deployment`` (no fedstream code)."""
