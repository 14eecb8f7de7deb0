"""pffs: a unified caching filesystem for AI data (S3 and HDFS as one FUSE tree)."""

from pffs.config import FuseConfig, MetaConfig, MountConfig, RetryConfig, SourceConfig
from pffs.version import __version__


def mount(config: MountConfig, foreground: bool = False) -> int:
    """Mount `config`; in the background (default) return the daemon's pid once live."""
    from pffs.mounting.daemon import start_daemon
    from pffs.mounting.serving import serve_here

    if foreground:
        serve_here(config)
        return 0
    pid, _ = start_daemon(config)
    return pid


__all__ = [
    "FuseConfig",
    "MetaConfig",
    "MountConfig",
    "RetryConfig",
    "SourceConfig",
    "__version__",
    "mount",
]
