"""The file system without the kernel: namespace and inodes, handles, reads, writes and staging,
renames and removals, the hidden `.pffs` files, composed by one facade (`vfs.Vfs`) that
pffs.fuse_ops adapts.

It speaks trio and pffs types; it never imports pyfuse3. Below it: pffs.routing (which source
holds a path), pffs.cache (blocks) and the backends. No part inherits from another: a new
behaviour is a new part the facade composes, as preload by dataset (`datasets`) is.
"""
