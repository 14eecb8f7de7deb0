"""Who may ask what of `pffs fluid`: the ThinRuntimeProfile's author is trusted, the authors of
Datasets and ThinRuntimes are not.

Fluid runs pffs's FUSE container as root, privileged, with hostPath volumes, and builds its
config from objects that namespace users write (pkg/ddc/thin/transform_config.go,
transform_fuse.go): the config's `mounts` (and their options) come from the Dataset,
`runtimeOptions` from the ThinRuntime's `fuse.options`, and the MOUNT_OPTIONS variable joins
the profile's `fuse.options` with the ThinRuntime's, which override them: nothing in it tells
the two apart. Only the container's command line is the profile's alone (once a cluster
policy stops ThinRuntimes overriding `fuse.command`, `args`, `env`, `image` and volumes, as
Fluid otherwise lets them), so that is where the trusted settings are: `pffs fluid --options
... --allow-local DIR --allow-node-credentials --allow-option KEY --secrets-dir DIR` (a
`Policy`). From everything else:

- a secret is a value, or a file under the secrets directory (/etc/fluid/secrets/, where Fluid
  mounts each Secret): resolved (Kubernetes' own `..data` links stay inside it), refused
  when it leads outside, and opened with O_NOFOLLOW;
- only the stores the policy lists (`check_source`): S3, HDFS with a namenode named, and the
  backends that read the node's own files (`local://`, `file://`, `arrow+file://`: every
  scheme the backend registry marks `node_files`) only under a directory the profile names
  (`--allow-local`); any other scheme is refused, so a backend added to pffs is not a Dataset's
  to use until it is listed here;
- a mount without keys of its own (S3 by the container's default chain, that is the node's
  role; a named profile; HDFS without a ticket cache from the secrets) only with
  `--allow-node-credentials`;
- of the whole-mount options, only the data options the option table marks (and those the profile
  adds with `--allow-option`): `cache-dir`, `log-file`, `metrics`, `uid`, `gid`, the modes and
  the other options that reach the node come from the profile.

Each refusal is one UsageError (exit status 2) naming the option.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pffs.backends import REGISTRY
from pffs.credentials import checked
from pffs.errors import UsageError
from pffs.optiontable import OPTIONS

SECRETS_DIR = "/etc/fluid/secrets"
# Whole-mount options a Dataset or ThinRuntime may set (option dests, so a former name of
# one counts too): how its data is read and kept fresh, nothing that reaches the node. The
# option table marks them (`dataset`).
DATA_OPTIONS = frozenset(option.dest for option in OPTIONS if option.dataset)
# The stores a Dataset may name beside the node's own files: each reaches a store over the
# network with keys of its own (or the node's, under --allow-node-credentials).
REMOTE_SCHEMES = ("s3", "hdfs")
# The schemes that read this machine's files, from the backend registry (`node_files`), so a
# new local backend is held to --allow-local without a list here to keep up.
NODE_FILE_SCHEMES = tuple(scheme for scheme, entry in REGISTRY.items() if entry.node_files)
# hdfs:// without a namenode (or with `default`) is whatever fs.defaultFS of the container's
# Hadoop configuration names, file:/// when none is set: the node's files.
HDFS_DEFAULT_HOSTS = ("", "default")
# A secret file holds one key or token: a few KiB.
MAX_SECRET_FILE = 64 << 10


@dataclass(frozen=True)
class Policy:
    """What the profile (the container's command line) sets, and allows the untrusted side."""

    # The profile's own mount options (`--options k=v,k,...`): any `pffs mount` option.
    options: tuple[str, ...] = ()
    # Where Fluid mounts the Secrets a Dataset names (a temporary directory in tests).
    secrets_dir: str = SECRETS_DIR
    # local:// and file:// mounts are allowed under these directories only.
    local_roots: tuple[str, ...] = ()
    # Mounts without keys of their own: the container's credential chain (the node's).
    node_credentials: bool = False
    # Whole-mount options (dests) the untrusted side may set beyond DATA_OPTIONS.
    allowed_options: frozenset[str] = frozenset()


def check_whole_mount_option(dest: str, where: str, policy: Policy) -> None:
    """Refuse a whole-mount option the untrusted side may not set."""
    if dest not in DATA_OPTIONS and dest not in policy.allowed_options:
        raise UsageError(
            f"{where}: only the profile sets this option (`pffs fluid --options`, or "
            "`--allow-option` to let Datasets set it)"
        )


def check_node_credentials(where: str, what: str, policy: Policy) -> None:
    """Refuse a mount that would use the container's own credentials, unless allowed."""
    if not policy.node_credentials:
        raise UsageError(
            f"{where}: {what} would use the node's own credentials; give the mount keys "
            "(encryptOptions), or the profile `pffs fluid --allow-node-credentials`"
        )


def check_source(url: str, where: str, policy: Policy) -> None:
    """Refuse a source URL the policy does not list, or a node directory it does not allow."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in NODE_FILE_SCHEMES:
        # As the local backends read it: %2e%2e is .., the host must be empty or localhost.
        check_local(unquote(parts.path), where, policy)
        return
    if scheme == "hdfs" and (parts.hostname or "") in HDFS_DEFAULT_HOSTS:
        raise UsageError(
            f"{where}: hdfs:// without a namenode reads the container's default file system; "
            "name it (hdfs://namenode:8020/path)"
        )
    if scheme not in REMOTE_SCHEMES:
        shown = f"{scheme}://" if scheme else "no scheme"
        local = ", ".join(f"{s}://" for s in ("local", *NODE_FILE_SCHEMES))
        raise UsageError(
            f"{where}: {url!r} has {shown}; a Dataset may name "
            f"{', '.join(f'{s}://' for s in REMOTE_SCHEMES)}, and {local} under the "
            "profile's --allow-local"
        )


def check_local(path: str, where: str, policy: Policy) -> None:
    """Refuse a directory of the node outside every root the profile allows."""
    real = os.path.realpath(path)
    for root in policy.local_roots:
        if _is_under(real, os.path.realpath(root)):
            return
    allowed = ", ".join(policy.local_roots) or "none"
    raise UsageError(
        f"{where}: local directories are not allowed here (the profile's "
        f"`pffs fluid --allow-local DIR`; allowed: {allowed})"
    )


def secret_path(path: str, where: str, policy: Policy) -> str:
    """`path` resolved, when it names a regular file under the secrets directory."""
    root = os.path.realpath(policy.secrets_dir)
    real = os.path.realpath(path)
    if not _is_under(real, root) or real == root:
        raise UsageError(f"{where}: a secret file must be under {policy.secrets_dir}")
    return real


def read_secret(value: str, where: str, policy: Policy) -> str:
    """A secret option's value: the content of the file it names under the secrets directory
    (Fluid's default config storage, a ConfigMap), or the value itself (config storage
    Secret: not a path)."""
    if not value.startswith("/"):
        return checked(value, where)
    real = secret_path(value, where, policy)
    try:
        # O_NOFOLLOW: the resolved path must still be a file, not a link put there since.
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read the secret file {value}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{where}: the secret file {value} is not a regular file")
        data = f.read(MAX_SECRET_FILE + 1)
    if len(data) > MAX_SECRET_FILE:
        raise UsageError(f"{where}: the secret file {value} is larger than a key or token")
    try:
        text = data.decode("utf-8").strip()  # `kubectl create secret --from-file` keeps a \n
    except UnicodeDecodeError:
        raise UsageError(f"{where}: the secret file {value} is not UTF-8 text") from None
    return checked(text, f"{where}: the secret file {value}")


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
