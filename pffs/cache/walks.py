"""A forward walk of a file in hops, as a mapped file's reader makes it: told from a pread's.

Pure bookkeeping with no I/O (pffs.cache.readahead composes it). pyarrow's `read_all` of an
Arrow IPC stream by mmap (`datasets`' tables) walks the file's messages from its start: each
record batch's metadata is a page fault, one batch (16 MB in the bench's file) past the one
before, and the kernel brings each fault's read-around (two READs of 1 MiB, either first) and
one more READ in order (its async readahead): a hop of about 3 MiB, then a jump forward by about
the same stride, one hop at a time (a round trip each). Its bodies are read later, at random
(the gathers): the whole file is wanted, and waiting for the gathers' random faults to show it
(pffs.cache.readahead `SWEEP_SHARE`) costs a round trip per hop and per early fault.

What tells the walk apart (the traces: docs/notes/clients-arrow-mmap.md):

- it starts at the file's first byte, and every hop since is short (a read-around: at least two
  large READs, at most `HOP_MOST` bytes, then and later) and lands past the one before by more
  than its own length: a gap, never back;
- the strides between hops' starts are alike (the batches' sizes), within `STRIDE_SLACK`.

A Parquet projection (pyarrow's preads of a few column chunks, buffered reads) starts at the
footer, not the first byte, and each chunk is one READ of its own size, a few at once out of
order; a lazy loader's tensors (safetensors' `safe_open`) start at the header, at the first byte,
but a tensor is a run of many READs (longer than a hop), in no order. Neither is a walk. Nor is
a whole-file loader's copy (safetensors' `load_file`): its faults come at each tensor's start
and in the tensor before it, so the first hops look like a walk at the tensors' stride until
the kernel's READs fill the gaps, growing a hop past `HOP_MOST` (taken for a walk, a 512 MiB
checkpoint was loaded whole ahead of its reader, a fifth of it read back from the disk tier).
Small tensors read in the file's order at alike strides, with nothing filling the gaps, would
be one; the file is then loaded whole (within what the cache keeps unread), which costs bytes
the loader never reads.
"""

from __future__ import annotations

MIB = 1 << 20
# A hop reads at most this much: a fault's read-around (2 MiB: the mount's read_ahead_kb) and a
# READ of readahead after it; a tensor copied out (a lazy loader's) reads more.
HOP_MOST = 4 * MIB
# Hops past the file's start, each one short and landing forward past the one before, before
# the walk is told: at the first READ of the hop after them (the third fault: the walk starts
# a stride from the start, and two strides show they are alike).
WALK_HOPS = 2
# How far two strides may differ, as a share of the first, and still be a walk's.
STRIDE_SLACK = 0.25
# A READ this far behind a hop's start is still part of it: the read-around's two READs may
# come in either order.
BEHIND = 1 * MIB


class _Hop:
    __slots__ = ("end", "reads", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.reads = 1

    def takes(self, offset: int) -> bool:
        """Whether a READ at `offset` is part of this hop (in it, at its end or just behind)."""
        return self.start - BEHIND <= offset <= self.end

    def add(self, offset: int, end: int) -> None:
        self.start = min(self.start, offset)
        self.end = max(self.end, end)
        self.reads += 1

    def short(self) -> bool:
        return self.reads >= 2 and self.end - self.start <= HOP_MOST


class HopWalk:
    """The large READs of one open file, seen as hops: whether they walk it forward from its
    start (`walking`, once told; `front`: where the walk was when told)."""

    def __init__(self) -> None:
        self._hops: list[_Hop] = []  # the last two, newest last
        self._counted = 0  # short hops landing forward past the one before, from the start
        self._stride = 0  # between the first two hops' starts
        self.broken = False  # a READ since the start was no walk's: never one for this file
        self.walking = False
        self.front = 0

    def read(self, offset: int, end: int) -> None:
        """A large READ (the kernel's read-around or readahead) of [offset, end)."""
        if self.broken or self.walking:
            return
        hops = self._hops
        if not hops:
            if offset != 0:
                self.broken = True  # no walk from the start (a footer first, a seek)
                return
            hops.append(_Hop(offset, end))
            return
        for hop in reversed(hops):  # the last hop's straggler may come after the next's first
            if hop.takes(offset):
                hop.add(offset, end)
                if hop.end - hop.start > HOP_MOST:
                    self.broken = True  # a run, not a hop: a reader in order filling it in
                return
        last = hops[-1]
        if not last.short() or offset < last.end + (last.end - last.start):
            self.broken = True
            return
        stride = offset - last.start
        if self._counted == 0:
            self._stride = stride
        elif abs(stride - self._stride) > self._stride * STRIDE_SLACK:
            self.broken = True
            return
        self._counted += 1
        hops.append(_Hop(offset, end))
        del hops[:-2]
        if self._counted >= WALK_HOPS:
            self.walking = True
            self.front = offset
