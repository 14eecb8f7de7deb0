"""`python -m bench`: the benchmark suite (see bench/cli.py and docs/BENCHMARKS.md)."""

from bench.cli import main

raise SystemExit(main())
