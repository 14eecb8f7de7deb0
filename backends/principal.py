"""Who a backend reads its store as: a digest of the principal, for the cache's keys.

The block cache is shared: every mount and `pffs warmup` on one cache directory, and every
source of one mount. A block's key therefore names the principal that read it as well as the
store, the path and the version (pffs.cache.keys), so two mounts of one bucket with different
credentials share nothing, and each reads only what its own credentials allow.

A principal is named by a digest, never by the credential itself: SHA-256 over a
domain-separated string, truncated to 128 bits. It is written only into the cache's own key
digests and the manifests of staged writes (pffs.fs.staging, in the 0700 cache directory);
it is neither logged nor shown. What it covers, per store:

- S3 (`s3_principal`): for keys (explicit, environment, credentials or config file, a
  credential process), the access key id and its secret key, so knowing another tenant's key
  id is not enough to share its blocks. For a role assumed from the profile, a web identity
  (AWS_ROLE_ARN and its token file) or SSO, the role and account as configured: known without
  a network call, and stable across the temporary keys the role hands out. For the instance's
  own role (EC2 metadata), one name per machine: every process on it gets that role. No
  credentials at all (anonymous reads) is a principal of its own.
- HDFS (`hdfs_principal`): the user named to HDFS (the option, HADOOP_USER_NAME, or the login
  name) and the Kerberos principal of the ticket cache in use (read from the cache file).
- Local files (`local_principal`): the process's uid, gid and groups, which the kernel checks.

Where a principal cannot be told exactly, the digest covers more rather than less: a block
shared between two principals that should not share is the one outcome to avoid, and a cache
split more finely than needed only costs fetches.

A principal with a static credential of its own (S3 keys) also has a key that proves it to a
cache group's peers (`s3_principal_key`): an HMAC keyed by its secret key, which only the
holders of that secret key can make (pffs.group.principals). The others (a role, a web
identity, the instance's role, anonymous reads, HDFS, local files) have none here.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import struct
from collections.abc import Mapping
from typing import Any

_DOMAIN = b"pffs principal v1\0"
_KEY_DOMAIN = b"pffs principal key v1\0s3 keys\0"
_DIGEST_HEX = 32  # 128 bits

# botocore credential methods (the provider's METHOD) whose keys come from assuming a role
# named in the profile or the environment. Their credentials are resolved on first use (a
# call to STS or SSO), so the role, not the key, names them.
_ROLE_METHODS = {"assume-role", "assume-role-with-web-identity", "sso"}
# The instance's own role: one per machine, whatever keys it hands out this hour.
_INSTANCE_ROLE = "iam-role"
# A ticket cache is small; a longer read is not a ticket cache.
_CCACHE_MAX = 1 << 16


def principal_digest(store: str, *identity: str) -> str:
    """The digest naming principal `identity` of a `store` kind ("s3", "hdfs", "file")."""
    text = "\0".join((store, *identity)).encode("utf-8", "surrogateescape")
    return hashlib.sha256(_DOMAIN + text).hexdigest()[:_DIGEST_HEX]


def s3_principal(
    credentials: Any, scoped_config: Mapping[str, Any], environ: Mapping[str, str]
) -> str:
    """The principal of a boto3 session's `credentials` (None: anonymous), its profile's
    `scoped_config` and the environment (module doc). No network call for the kinds named
    there; another kind of deferred credentials is resolved here (its first call)."""
    if credentials is None:
        return principal_digest("s3", "anonymous")
    method = str(getattr(credentials, "method", "") or "")
    if method in _ROLE_METHODS:
        return principal_digest("s3", method, *_role_identity(scoped_config, environ))
    if method == _INSTANCE_ROLE:
        return principal_digest("s3", method)
    frozen = credentials.get_frozen_credentials()
    return principal_digest("s3", "keys", frozen.access_key or "", frozen.secret_key or "")


def s3_principal_key(credentials: Any) -> bytes | None:
    """The key proving the principal of S3 `credentials` to peers: derived from the secret key
    of static keys (explicit, environment, credentials file, a credential process); None for
    the kinds without one of their own (anonymous, a role, a web identity, SSO, the
    instance's role)."""
    if credentials is None:
        return None
    method = str(getattr(credentials, "method", "") or "")
    if method in _ROLE_METHODS or method == _INSTANCE_ROLE:
        return None
    frozen = credentials.get_frozen_credentials()
    if not frozen.secret_key or frozen.token:  # temporary keys change: not static
        return None
    message = _KEY_DOMAIN + (frozen.access_key or "").encode("utf-8", "surrogateescape")
    secret_key = frozen.secret_key.encode("utf-8", "surrogateescape")
    return hmac.new(secret_key, message, "sha256").digest()


def _role_identity(scoped_config: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """What names an assumed role as configured: the profile's role and SSO settings and the
    web identity's environment. All of them, whichever the provider used: a setting that
    does not name this role only splits the cache further."""
    profile_keys = (
        "role_arn",
        "web_identity_token_file",
        "sso_session",
        "sso_start_url",
        "sso_account_id",
        "sso_role_name",
    )
    identity = [f"{key}={scoped_config.get(key) or ''}" for key in profile_keys]
    environment_keys = ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
    identity += [f"{key}={environ.get(key, '')}" for key in environment_keys]
    return identity


def hdfs_principal(
    user: str | None, ticket_cache: str | None, environ: Mapping[str, str] = os.environ
) -> str:
    """The principal an HDFS connection authenticates as: the user named to HDFS, and the
    Kerberos principal of the ticket cache in use (`ticket_cache`, else KRB5CCNAME, else the
    default /tmp/krb5cc_UID), or where that cache cannot be read, its name. Both, whichever
    the cluster's authentication uses: a ticket cache left beside simple authentication only
    splits the cache further, never joins two users."""
    cache = ticket_cache or environ.get("KRB5CCNAME") or f"/tmp/krb5cc_{os.geteuid()}"
    kerberos = ccache_principal(cache.removeprefix("FILE:"))
    if kerberos is None and not (ticket_cache or environ.get("KRB5CCNAME")):
        kerberos = ""  # no ticket cache anywhere: simple authentication
    ticket = f"kerberos {kerberos}" if kerberos is not None else f"ticket cache {cache}"
    return principal_digest("hdfs", _login_user(user, environ), ticket)


def _login_user(user: str | None, environ: Mapping[str, str]) -> str:
    if user:
        return user
    if environ.get("HADOOP_USER_NAME"):
        return environ["HADOOP_USER_NAME"]
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no name
        return f"uid {os.getuid()}"


def ccache_principal(path: str) -> str | None:
    """The default principal (`name/instance@REALM`) of an MIT Kerberos FILE ticket cache
    (versions 3 and 4; their layout is the header then the principal); None when the file is
    not one."""
    try:
        with open(path, "rb") as f:
            data = f.read(_CCACHE_MAX)
        if data[0] != 5 or data[1] not in (3, 4):
            return None
        at = 2
        if data[1] == 4:
            (header_length,) = struct.unpack_from(">H", data, at)
            at += 2 + header_length
        _name_type, count = struct.unpack_from(">II", data, at)
        at += 8
        words = []
        for _ in range(count + 1):  # the realm, then each component
            (length,) = struct.unpack_from(">I", data, at)
            at += 4
            if at + length > len(data):
                return None
            words.append(data[at : at + length].decode("utf-8", "replace"))
            at += length
    except (OSError, IndexError, struct.error):
        return None
    realm, *components = words
    return f"{'/'.join(components)}@{realm}"


def local_principal() -> str:
    """The principal of this process on local files: the ids the kernel checks access with."""
    groups = ",".join(str(group) for group in sorted(set(os.getgroups())))
    return principal_digest("file", str(os.geteuid()), str(os.getegid()), groups)
