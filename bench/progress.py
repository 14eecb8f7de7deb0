"""Where a bench session is: its expected duration up front, then each run and scenario.

A session is a list of runs, one per server, latency, repetition and system, each mounting one
system and running every scenario. `expected_seconds` guesses the session's length before it
starts, from the dataset's sizes and the round trip: a rough model (the slowest system pays a
round trip or two per file it looks up or reads, bytes move at about 100 MB/s), meant to tell a
user "4 minutes" from "3 hours", not to predict. `Progress` then prints, to stderr, each run and
scenario as it starts, with the time elapsed and, once runs have finished, the time left at the
session's own pace so far.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from bench.data import Sizes
from bench.metadata import LS_RECURSIVE_LIMIT_S

MOUNT_S = 2.0  # one mount or unmount of a peer, waited for
MOUNTS_PER_RUN = 3  # the run's own and the remounted epoch's two
ROUND_TRIPS_PER_FILE = 2  # a peer's lookup and read of a file it has not seen
LOCAL_TRIP_S = 0.002  # a request to a server on this machine, the delay aside
BYTES_PER_S = 100e6  # reads, writes and uploads, all told
PUTS_PER_S = 300.0  # uploads of small objects (the servers here are the limit)
EPOCH_READERS = 8  # bench.epoch.WORKERS
EPOCHS_PER_RUN = 4  # epochs 1 and 2, and the remounted epoch's fill and read


@dataclass(frozen=True)
class Run:
    server: str
    latency_ms: float
    rep: int  # from 0
    system: str


def expected_seconds(
    sizes: Sizes, servers: int, latencies: list[float], systems: int, reps: int, per_run: float
) -> float:
    """The session's rough length: uploads per server, then every run. `per_run` is the fixed
    part of one run (its rests, timed scenarios and waits past TTLs)."""
    objects = sizes.small_files + sizes.wide_files + sizes.epoch_files + sizes.tree_files
    large_objects = sizes.checkpoint + sizes.shard_files * sizes.shard_size
    upload = (sizes.large + sizes.parallel + large_objects) / BYTES_PER_S + objects / PUTS_PER_S
    runs = 0.0
    for latency in latencies:
        trip = latency / 1000 + LOCAL_TRIP_S
        files = EPOCHS_PER_RUN * sizes.epoch_files / EPOCH_READERS
        files += sizes.small_files + sizes.wide_files
        tree = min(sizes.tree_files * ROUND_TRIPS_PER_FILE * trip, LS_RECURSIVE_LIMIT_S)
        moved = 3 * sizes.large + sizes.parallel + 2 * sizes.write + large_objects
        runs += files * ROUND_TRIPS_PER_FILE * trip + tree + moved / BYTES_PER_S
        runs += MOUNTS_PER_RUN * MOUNT_S + per_run
    return servers * (upload + reps * systems * runs)


def duration(seconds: float) -> str:
    """1234.5 -> "20m35s"; 42 -> "42s"."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class Progress:
    """Prints where the session is, one line per run and per scenario."""

    def __init__(self, total_runs: int, expected: float) -> None:
        self.total = total_runs
        self.done = 0
        self.started = time.monotonic()
        self.current = ""
        print(
            f"bench: {total_runs} runs (server x latency x repetition x system), "
            f"expected to take about {duration(expected)}",
            file=sys.stderr,
        )

    def _times(self) -> str:
        elapsed = time.monotonic() - self.started
        text = f"{duration(elapsed)} elapsed"
        if self.done:  # runs past setup: the pace of the ones done
            left = elapsed / self.done * (self.total - self.done)
            text += f", about {duration(left)} left"
        return text

    def run(self, run: Run, reps: int) -> None:
        """A run starts: the next of `total`."""
        self.current = (
            f"[{self.done + 1}/{self.total} {run.server}, {run.latency_ms:g} ms, {run.system}, "
            f"rep {run.rep + 1}/{reps}]"
        )
        print(f"{self.current} mounting ({self._times()})", file=sys.stderr)

    def scenario(self, key: str, index: int, count: int) -> None:
        """A scenario of the current run starts."""
        self.step(f"{key} ({index}/{count})")

    def step(self, text: str) -> None:
        """A step of the current run starts."""
        print(f"{self.current} {text} ({self._times()})", file=sys.stderr)

    def run_done(self) -> None:
        self.done += 1

    def note(self, text: str) -> None:
        """A step outside the runs (starting a server, uploading)."""
        print(f"bench: {text} ({self._times()})", file=sys.stderr)
