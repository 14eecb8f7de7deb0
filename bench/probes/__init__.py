"""One-off measurements kept for the next time their question comes up (see README.md here).

Not the suite (`python -m bench`): each probe times one part of pffs alone, to decide a design
or find where the time of a suite figure goes. Run one with `python -m bench.probes.<name>`.
"""
