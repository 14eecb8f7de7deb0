"""A cache group: mounts that serve each other's blocks, so each block comes from the store once.

A block has one owner among the group's members (`placement`: rendezvous hashing of its key).
A miss asks the owner first (`client`), whose server (`server`) hands the ask to the owner's
side (`server.PeerBlocks`): from its cache, or fetched once through the same block cache and store
(pffs.store) its own readers use, which the mount's assembly point hands it. Any failure
on the way (refused, timed out, a 5xx, a reply whose version, length or CRC32C is wrong) means
the asker fetches from the store itself; a breaker per peer (`breaker`) stops asking a broken
one for a while. Members come from a file (`members`), a DNS name (`dnsmembers`) or Kubernetes
EndpointSlices (`kubemembers`); every
request is signed with an HMAC of a shared secret (`signing`). `peers.Group` composes them.
Its second form is a shared tier (`shared`): an S3-compatible store near the compute that
holds blocks for everyone. Both are tiers before the store (`sources`): each object's block
source (pffs.cache.keys.BlockSource) is then the tier, else its store.

The group is a layer on the cache and the store (pffs.store): it names blocks by the cache's
keys and loads a peer's block through both; neither imports it. pffs.mounting composes it and
hands the tier joined (`sources.Joined`) to the parts that build block sources (the VFS's reader
and dataset preload, warmup), which put it before each object's store (pffs.store.fetching).
Without a group nothing of this is imported.
"""
