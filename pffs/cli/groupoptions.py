"""The options of `pffs mount` that join a cache group (pffs.group), and their checks.

`--group-members SOURCE --group-listen HOST:PORT --group-secret-file FILE [--group-self NAME]
[--group-handover SECONDS] [--group-principal-secret-file FILE]`
(`k8s://` reads the API as the pod's service account, or outside a pod at $PFFS_KUBE_API, such
as `kubectl proxy`'s http://127.0.0.1:8001), or the group's second form, a shared tier:
`--shared-cache s3://BUCKET/PREFIX --shared-cache-secret-file FILE [--shared-cache-endpoint URL]
[--shared-cache-profile NAME]`.
The options themselves are rows of pffs.optiontable (section "group" and "shared"); they go
together, so they are checked here as a whole, before a daemon starts: bad input is one line
and exit 2.
"""

from __future__ import annotations

import argparse
import os
import socket

from pffs.config import GroupConfig, SharedCacheConfig
from pffs.errors import UsageError
from pffs.group import members, signing
from pffs.group.dnsmembers import parse_dns_source
from pffs.group.kubemembers import parse_k8s_source
from pffs.group.server import parse_listen

# The Kubernetes API outside a pod, for `k8s://` members (inside one: the service account).
KUBE_API_ENV = "PFFS_KUBE_API"


def shared_cache_config(args: argparse.Namespace) -> SharedCacheConfig | None:
    """The shared tier, or None without --shared-cache."""
    url = getattr(args, "shared_cache", None)
    if not url:
        for option in ("shared_cache_endpoint", "shared_cache_profile", "shared_cache_secret_file"):
            if getattr(args, option, None):
                raise UsageError(f"--{option.replace('_', '-')} needs --shared-cache")
        return None
    if getattr(args, "group_members", None):
        raise UsageError("--shared-cache and --group-members: a mount uses one or the other")
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    if not url.startswith("s3://") or not bucket:
        raise UsageError(f"--shared-cache {url}: expected s3://BUCKET/PREFIX")
    secret_file = getattr(args, "shared_cache_secret_file", None)
    if not secret_file:
        raise UsageError("--shared-cache needs --shared-cache-secret-file (the tier's MAC key)")
    secret_file = os.path.abspath(secret_file)
    signing.read_secret(secret_file, "--shared-cache-secret-file")
    return SharedCacheConfig(
        url, args.shared_cache_endpoint, args.shared_cache_profile, secret_file
    )


def group_config(args: argparse.Namespace) -> GroupConfig | None:
    """The group to join, or None without --group-members (a mount exactly as without groups)."""
    source = getattr(args, "group_members", None)
    if not source:
        for option in (
            "group_listen",
            "group_secret_file",
            "group_self",
            "group_handover",
            "group_principal_secret_file",
        ):
            if getattr(args, option, None) not in (None, ""):  # a handover of 0 was given too
                flag = "--" + option.replace("_", "-")
                raise UsageError(f"{flag} needs --group-members")
        return None
    if not args.group_listen or not args.group_secret_file:
        raise UsageError("--group-members needs --group-listen HOST:PORT and --group-secret-file")
    self_name = args.group_self or os.environ.get("NODE_NAME") or socket.gethostname()
    try:
        members.check_name(self_name)
    except UsageError as exc:
        raise UsageError(f"--group-self: {exc}") from None
    kube_api = None
    if source.startswith("file:"):
        members.read_member_file(members.file_path(source))
    elif source.startswith("k8s:"):
        parse_k8s_source(source)
        kube_api = os.environ.get(KUBE_API_ENV) or None
        if kube_api is not None and not kube_api.startswith(("http://", "https://")):
            raise UsageError(f"{KUBE_API_ENV}={kube_api}: expected an http:// or https:// URL")
    elif source.startswith("dns:"):
        parse_dns_source(source)
    else:
        raise UsageError(
            f"--group-members {source}: expected file:///PATH, k8s://NAMESPACE/SERVICE or "
            "dns://NAME:PORT"
        )
    parse_listen(args.group_listen)
    secret_file = os.path.abspath(args.group_secret_file)
    signing.read_secret(secret_file)
    handover = getattr(args, "group_handover", None)
    if handover is None:
        handover = GroupConfig.handover
    principal_secret_file = getattr(args, "group_principal_secret_file", None) or None
    if principal_secret_file is not None:
        principal_secret_file = os.path.abspath(principal_secret_file)
        signing.read_secret(principal_secret_file, "--group-principal-secret-file")
    return GroupConfig(
        source,
        args.group_listen,
        secret_file,
        self_name,
        kube_api,
        handover,
        principal_secret_file,
    )
