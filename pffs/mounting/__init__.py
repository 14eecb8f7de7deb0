"""A mount's life in the kernel and as a process: the mountpoint and /proc mount state, the
preflight checks, assembling and serving a mount, the daemon hand-off, and the recovery of
staged writes a crashed mount left behind."""
