"""fedstream benchmarks (not tests): run them as scripts, e.g. ``python bench/ingest.py``."""
