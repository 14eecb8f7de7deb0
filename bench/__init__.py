"""The benchmark suite (issue: bench/). Run with `python -m bench`."""
