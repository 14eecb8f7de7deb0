"""The flow controller: what is in flight to a store, and what is held ahead of readers.

One place decides both (docs/notes/flow-control.md has the numbers and what they rest on):

- `permits`: per source, how many requests may be in flight to its store and who goes first
  (`SourceFlow.permit`: a waiting reader, then readahead, then preload, then warmup; loading
  ahead paced by AIMD when the store throttles). Every store request takes one: the readers'
  (pffs.store.fetching, namespace and its listings, writes), loading ahead's (readahead, regions,
  preload, warmup), the owner's side of a cache group, the shared tier's reads, claims and
  writes. A cache group's asks of its peers take the group's `PeerFlow`, by the same priorities.
- `budget`: per mount, the bytes of blocks held or loading ahead of readers
  (`AheadBudget`), which readahead, preload, warmup and regions' spans draw from.

Caps left elsewhere on purpose, none sized for store requests: the disk tier's threads and its
write-behind slots (pffs.cache.diskio: the disk's pace, not the store's); a staging upload's
parts in flight (pffs.fs.staging: each part's request takes a reader permit; the cap bounds the
staging file's bytes read at once) and its threads (pffs.fs.writes); parking's scratch-file
threads (pffs.fs.parking: local disk); synthesised
directories' listing threads (pffs.fs.namespace: no source, no store request); `pffs warmup
--through`'s files read at once (pffs.cli.warmthrough: reads through a mount); and one-at-a-time
locks (the page cache's settling, the preload socket, a member list's refresh). What each
reader's window asks for (pffs.cache.window) and which blocks a file's readahead wants
(pffs.cache.readahead) are the reader's side: they ask this budget and these permits.
"""
