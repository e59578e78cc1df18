"""specdec-cpu's benchmark suite: ``python -m bench`` (see bench/run.py)."""
