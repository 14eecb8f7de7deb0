"""Which key proves a principal to the group's peers (pffs.group.signing's `x-pffs-proof`).

A member serves a peer a block only as a principal the request proves: an HMAC of the request
keyed by that principal's key, which only its holders can make. A principal with a static
credential of its own (S3 keys) has its key derived from that credential by its backend
(pffs.backends.principal.s3_principal_key): the mounts holding those keys prove it, and no one
else. A principal without one (an assumed role, a web identity, the instance's role, anonymous
reads, HDFS, local files) is proven with a key derived from the principal secret the admin
gives the mounts that share it (`--group-principal-secret-file`); without that secret such a
principal's blocks are never asked of peers, and an owner refuses them (403). Holding the
principal secret therefore grants reading, through any member, as every credential-less
principal of the mounts it was given to.
"""

from __future__ import annotations

import hashlib
import hmac

_VOLUME_DOMAIN = b"pffs principal key v1\0volume\0"


class PrincipalKeys:
    """The proof keys of one process, from its backends' static keys and its principal
    secret (None: none given)."""

    def __init__(self, principal_secret: bytes | None) -> None:
        self._secret = principal_secret

    def key(self, principal: str, static_key: bytes | None) -> bytes | None:
        """The key proving `principal` (a digest), whose static key is `static_key`."""
        if static_key is not None:
            return static_key
        if self._secret is None:
            return None
        return hmac.new(self._secret, _VOLUME_DOMAIN + principal.encode(), hashlib.sha256).digest()
