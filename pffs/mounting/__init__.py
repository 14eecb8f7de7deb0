"""A mount's life in the kernel and as a process: the mountpoint and /proc mount state, the
preflight checks, assembling and serving a mount (its cache, its cache group or shared tier,
its VFS), the daemon hand-off, the registry of live mounts, metrics wiring, the preload socket,
warmup through a mount's parts, and the recovery of staged writes a crashed mount left behind.
docs/ARCHITECTURE.md has the map of its modules."""
