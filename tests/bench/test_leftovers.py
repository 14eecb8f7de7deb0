"""bench.leftovers: its thread pool drops the work not started after a failure (as a Ctrl-C
would), and `stopped_cleanly` takes any failure after a stop signal for the stop."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from bench.leftovers import in_threads


def test_a_failure_drops_the_items_not_started() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        if item == 0:
            raise RuntimeError("the first item fails")
        time.sleep(0.01)
        with lock:
            done.append(item)

    with pytest.raises(RuntimeError, match="the first item fails"):
        in_threads(2, work, range(1000))  # 5 s of work if the rest were run first
    assert len(done) < 100


def test_every_item_runs_when_none_fails() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        with lock:
            seen.append(item)

    in_threads(4, work, range(50))
    assert sorted(seen) == list(range(50))


# A body stopped by `signal`, in a process of its own (a stopped run leaves the signals
# ignored): the stop is swallowed by an over-broad `except`, as a scenario's may, then the body
# fails as a read on a mount the same Ctrl-C ended does. What leaves `stopped_cleanly`?
STOPPED_BODY = """
import errno, os, signal, sys, time
from bench import leftovers

# Python's own SIGINT handler, as from a terminal: a run started in the background (nohup,
# `&`) inherits SIGINT ignored, and would show it ignored after any body.
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with leftovers.stopped_cleanly():
        try:
            os.kill(os.getpid(), signal.{signal}); time.sleep(5)
        except BaseException:
            pass
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
except BaseException as exc:
    print(type(exc).__name__, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""


@pytest.mark.parametrize(
    ("signal_name", "leaves_as"), [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Stopped")]
)
def test_a_failure_after_a_stop_signal_leaves_as_the_stop(signal_name: str, leaves_as: str) -> None:
    script = STOPPED_BODY.format(signal=signal_name)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [leaves_as, "True"], result.stdout + result.stderr


def test_a_failure_without_a_stop_stays_itself() -> None:
    script = STOPPED_BODY.replace("os.kill(os.getpid(), signal.{signal}); time.sleep(5)", "pass")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.stdout.split() == ["OSError", "False"], result.stdout + result.stderr


# trio.run inside `stopped_cleanly`, then a SIGTERM: no warning of trio's about the wakeup fd,
# the bench's stop-signal pipe the wakeup fd again after the run, and the stop seen.
TRIO_BODY = """
import os, signal, time, warnings
import trio
from bench import leftovers

def wakeup_fd():
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd

warnings.simplefilter("error")
try:
    with leftovers.stopped_cleanly():
        before = wakeup_fd()
        leftovers.run_trio(lambda: trio.sleep(0))
        print(before != -1 and wakeup_fd() == before)
        os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)
except BaseException as exc:
    print(type(exc).__name__)
"""


def test_trio_runs_inside_a_stoppable_run_without_a_warning_and_a_stop_is_still_seen() -> None:
    result = subprocess.run(
        [sys.executable, "-c", TRIO_BODY], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.stdout.split() == ["True", "Stopped"], result.stdout + result.stderr
