"""`python -m bench`: not written yet; says so instead of pretending."""

import sys

sys.stderr.write("bench: the benchmark suite is not implemented yet\n")
raise SystemExit(2)
