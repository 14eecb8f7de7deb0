"""Warmup's progress on a terminal: the bar redrawn on stderr, and the summary line.

It prints a `WarmupTally` (pffs.mounting.warmup), which the warmup itself keeps up to date.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import trio

from pffs.mounting.warmup import WarmupTally

GIB = 1 << 30
MIB = 1 << 20
# How often the bar is redrawn: often enough to look alive, rarely enough to cost nothing.
REDRAW_SECONDS = 0.5


@dataclass
class Progress:
    tally: WarmupTally = field(default_factory=WarmupTally)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        t = self.tally
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = t.bytes_done / elapsed
        share = t.bytes_done / t.bytes_total if t.bytes_total else 1.0
        bar = "#" * int(share * 24)
        eta = (t.bytes_total - t.bytes_done) / rate if rate > 0 else 0.0
        return (
            f"[{bar:<24}] {t.files_done}/{t.files_total} files  "
            f"{size_text(t.bytes_done)}/{size_text(t.bytes_total)}  "
            f"{rate / MIB:.0f} MiB/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        )

    def summary(self) -> str:
        t = self.tally
        elapsed = time.monotonic() - self.started
        rate = t.bytes_fetched / elapsed / MIB if elapsed > 0 else 0.0
        text = (
            f"warmup: {t.files_done} files, {size_text(t.bytes_total)}: "
            f"{size_text(t.bytes_fetched)} fetched, {size_text(t.bytes_cached)} already cached, "
            f"{t.blocks_skipped} blocks not stored (disk full), in {elapsed:.1f}s "
            f"({rate:.0f} MiB/s)"
        )
        if t.bytes_read_through:
            text += (
                f"; {size_text(t.bytes_read_through)} read through the mount "
                "(its cache keeps what it fetched)"
            )
        if t.failures:
            text += f"; {len(t.failures)} failed: " + "; ".join(t.failures[:3])
        return text

    async def draw(self) -> None:
        """Redraw the bar until cancelled."""
        while True:
            self.draw_once()
            await trio.sleep(REDRAW_SECONDS)

    def draw_once(self, end: str = "") -> None:
        sys.stderr.write("\r" + self.line() + end)
        sys.stderr.flush()


def size_text(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"
