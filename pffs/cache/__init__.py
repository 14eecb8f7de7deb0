"""The block cache: memory, then disk, then one fetch from the store per block.

It holds blocks, never files or paths of the tree, and never sees a backend: callers hand it
the block source of the object (keys.BlockSource), which it asks for bytes, or for runs of
blocks it pulls as a stream (docs/ARCHITECTURE.md, the path of a read).

Threading rule: worker threads, entered through `pffs.workers.run_blocking`, only move bytes and
use file descriptors (disk tier reads and writes, CRC and lz4, a block source's store call).
The cache's shared state (the memory tier, the in-flight table, the budget of bytes loaded
ahead and its bookkeeping, the background task count, the counters) is touched only from trio
tasks, so it needs no lock. Reading a counter from another thread (the metrics collector) is one
exception: it only reads. The disk tier's open entries (openentries.py) are the other: worker
threads and trio tasks share them under their own lock, and a trio task may read an open
entry itself when the page cache holds the bytes (RWF_NOWAIT, never waiting for the disk).

The modules, by idea; each composes the ones it needs, none inherits from another:

keys.py         BlockKey (source, principal, path, object version, index: a changed object
                has a new version, so its old blocks are never served for it), ObjectBlocks
                (an object version cut into blocks), and BlockSource, what any source of
                blocks implements (the store, a cache group, a test's fake): a reader's bytes
                as a value, runs of blocks as a stream.
blocks.py       BlockCache, what callers use: reads from the nearest tier, single-flight, the
                disk tier's partial reads for random access, the readahead entry point
                (`read_ahead`) and whole-object loads (`load`), and `Background`: the tasks the
                cache starts in the nursery it is given (write-behind, readahead) and waiting
                until none is left (flush before an unmount). It composes every module below
                but preload.py.
preload.py      Preloader: whole files loaded ahead of readers (dataset preload, order lists,
                warmup), lazily from jobs, as many at once as the sources' paces give preload
                (pffs.flow.permits), within a budget of bytes in flight and a bound on the bytes
                loaded and not yet read.
datasetroom.py  DatasetRoom: the datasets being consumed share most of the disk tier; one that
                does not fit its share keeps a subset chosen by a hash of its names, the
                blocks of its other files are not written to disk, nor preloaded.
singleflight.py The flights under way, by block, the one registry of blocks on their way:
                concurrent readers of one block wait for one load and share its bytes or its
                error; an abandoned flight sends them to load it themselves. In a cache group a
                flight also streams its block's pieces to the peers that join it.
readahead_engine.py
                ReadaheadEngine: readahead windows loaded in the background within a global
                budget of bytes in flight, as runs of consecutive missing blocks in one
                request, from the disk tier when it holds them, each block handed over as it
                lands (pulled from the source's stream); a failed or cancelled load gives its
                budget back; `load` is the same for one whole object, awaited (for
                preload.py). Beside it, AheadUsage counts the blocks loaded ahead that readers
                used and those evicted unread.
diskio.py       DiskIO: the disk tier as trio tasks use it, each call in a worker thread under
                one limiter and counted, and write-behind with a capped number of write slots,
                in batches (one worker-thread hop and one index transaction per batch); asks
                the key filter before the index, and keeps it in step with the index.
memory.py       MemoryTier: an LRU of blocks bounded in bytes.
disk.py         DiskTier: blocks in a diskcache directory, a corrupt entry dropped as a miss;
                blocking, thread- and process-safe, and per-source usage; reads through
                entries kept open, checked on each read (still linked, CRC); writes in
                batches (files first, then their index rows in one transaction).
diskindex.py    BatchIndex: a batch's rows into diskcache's SQLite index by its SQL, in one
                transaction, evicting past the bound; replaced files removed after the commit;
                the index's keys by rowid (for the filter).
diskkeys.py     DiskKeys: a Bloom filter of the disk tier's keys, so a block known to be absent
                (every block of a cold read) costs no worker-thread hop to look up.
openentries.py  OpenEntries: a bounded LRU of open entry descriptors with their parsed
                headers, sized from RLIMIT_NOFILE, shrinking when descriptors run out.
entries.py      A block's entry on disk: header, a CRC32C per 64 KiB, lz4 when it pays, key
                digest; checked reads of the whole block or a range; writes with O_DIRECT.
disklayout.py   The layout a disk tier directory holds, and clearing one written in another.
orphans.py      The sweep of entry files no index row names (a crash between the two writes).
readahead.py    Readahead: the per-file policy deciding which blocks are worth loading ahead,
                a window per sequential run (several per handle: a mapped file's faults, a
                lazy loader's tensors), a run from mid-file held to a share of what it read.
window.py       Windows: each sequential reader's window by Little's law (its read rate x its
                requests' time), carried by several GETs at once, within its fair share of the
                budget of bytes loaded ahead among the readers streaming at the time. (A
                source's pace, pffs.flow.permits, is another thing: its requests in flight.)
stats.py        CacheStats: the counters the metrics read.
pieces.py       Pieces, a block's bytes as its store sends them (a flight's, in a cache
                group): filled by the fetch path (pffs.store.fetching), streamed to the peers
                that join the flight.
"""
