"""The error types every layer speaks.

Errors cross two edges only (docs/ARCHITECTURE.md): a backend turns botocore / pyarrow / OS
errors into these types, and `pffs.fuse_ops` turns these types into errno values. Front ends
(the CLI, the CSI driver) turn them into one-line messages and exit codes.

Each class carries the errno a FUSE reply should use and the exit code a command should end
with, so the mapping lives in exactly one place: here.
"""

from __future__ import annotations

import errno


class PffsError(Exception):
    """Base of every error pffs raises on purpose. The message is one line meant for a user."""

    errno: int = errno.EIO
    exit_code: int = 1


# --- errors of the namespace and of the data ------------------------------------------------


class NotFound(PffsError):
    """The object or directory does not exist."""

    errno = errno.ENOENT
    exit_code = 3


class PermissionDenied(PffsError):
    """The store refused access (bad credentials, missing policy)."""

    errno = errno.EACCES
    exit_code = 4


class Transient(PffsError):
    """A failure that may succeed when retried (throttling, 5xx, timeouts, resets)."""

    errno = errno.EIO
    exit_code = 5


class Throttled(Transient):
    """The store asked for fewer requests (503 SlowDown, 429) and retries did not get through."""


class SourceDown(Transient):
    """The source is marked down (pffs.routing.health): a read needing it fails at once."""


class Changed(PffsError):
    """The object changed at the source while it was open: its version no longer matches."""

    errno = errno.ESTALE


class Corrupted(PffsError):
    """Bytes failed a checksum or had the wrong length."""

    errno = errno.EIO


class ReadOnly(PffsError):
    """A write was asked of a read-only mount or source."""

    errno = errno.EROFS


class Unsupported(PffsError):
    """The operation is not implemented for this source."""

    errno = errno.ENOTSUP


class CrossDevice(PffsError):
    """A rename between two sources of the mount table: the caller must copy instead."""

    errno = errno.EXDEV


class NotEmpty(PffsError):
    """rmdir of a directory that still has entries, or a rename onto one."""

    errno = errno.ENOTEMPTY


class Exists(PffsError):
    """The name is taken (mkdir of an existing name, rename with RENAME_NOREPLACE)."""

    errno = errno.EEXIST


class NoSpace(PffsError):
    """The local disk holding staged writes is full: the writer gets ENOSPC, readers nothing."""

    errno = errno.ENOSPC


class Busy(PffsError):
    """The entry is in use in a way that forbids the operation (a mount point of the table)."""

    errno = errno.EBUSY


class TooLarge(PffsError):
    """More than a limit allows (an order list over its caps)."""

    errno = errno.EFBIG


class IsADirectory(PffsError):
    errno = errno.EISDIR


class NotADirectory(PffsError):
    errno = errno.ENOTDIR


class BackendError(PffsError):
    """Any other failure of the store, already described in one line."""

    errno = errno.EIO
    exit_code = 5


# --- errors of the user's input (front ends) -------------------------------------------------


class UsageError(PffsError):
    """Invalid or conflicting options, a malformed URL, an unknown scheme."""

    errno = errno.EINVAL
    exit_code = 2


class MountpointError(PffsError):
    """The mountpoint is missing, not a directory, not empty or busy."""

    errno = errno.EINVAL
    exit_code = 6


class MountFailed(PffsError):
    """The kernel mount or the daemon failed to come up."""

    exit_code = 7


class CacheDirError(PffsError):
    """The cache or staging directory cannot be created or written (permissions, read-only)."""

    exit_code = 8
