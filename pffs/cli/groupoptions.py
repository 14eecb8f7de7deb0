"""The options of `pffs mount` that join a cache group (pffs.group), and their checks.

`--group-members SOURCE --group-listen HOST:PORT --group-secret-file FILE [--group-self NAME]
[--group-handover SECONDS] [--group-principal-secret-file FILE]`
(`k8s://` reads the API as the pod's service account, or outside a pod at $PFFS_KUBE_API, such
as `kubectl proxy`'s http://127.0.0.1:8001), or the group's second form, a shared tier:
`--shared-cache s3://BUCKET/PREFIX --shared-cache-secret-file FILE [--shared-cache-endpoint URL]
[--shared-cache-profile NAME]`.
The options themselves are rows of pffs.optiontable (section "group" and "shared"), each value
parsed by its row (the member source into its kind, HOST:PORT checked) and its config built by
the table (`optiontable.build`). They go together, so here they are checked as a whole and
their files read, before a daemon starts: bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import socket

from pffs import optiontable
from pffs.config import GroupConfig, MembersFile, MembersKube, SharedCacheConfig
from pffs.errors import UsageError
from pffs.group import members, signing
from pffs.optionvalues import BadValue, member_name

# The Kubernetes API outside a pod, for `k8s://` members (inside one: the service account).
KUBE_API_ENV = "PFFS_KUBE_API"


def shared_cache_config(args: argparse.Namespace) -> SharedCacheConfig | None:
    """The shared tier, or None without --shared-cache."""
    given = vars(args)
    if not given.get("shared_cache"):
        _refuse_without("shared", "shared-cache", given)
        return None
    if given.get("group_members"):
        raise UsageError("--shared-cache and --group-members: a mount uses one or the other")
    if not given.get("shared_cache_secret_file"):
        raise UsageError("--shared-cache needs --shared-cache-secret-file (the tier's MAC key)")
    config = optiontable.build(SharedCacheConfig, given)
    signing.read_secret(config.secret_file, "--shared-cache-secret-file")
    return config


def group_config(args: argparse.Namespace) -> GroupConfig | None:
    """The group to join, or None without --group-members (a mount exactly as without groups)."""
    given = vars(args)
    if not given.get("group_members"):
        _refuse_without("group", "group-members", given)
        return None
    if not given.get("group_listen") or not given.get("group_secret_file"):
        raise UsageError("--group-members needs --group-listen HOST:PORT and --group-secret-file")
    self_name = given.get("group_self") or os.environ.get("NODE_NAME") or socket.gethostname()
    try:
        member_name(self_name)
    except BadValue as exc:
        raise UsageError(f"--group-self: {exc}") from None
    kube_api = None
    if isinstance(given["group_members"], MembersKube):
        kube_api = os.environ.get(KUBE_API_ENV) or None
        if kube_api is not None and not kube_api.startswith(("http://", "https://")):
            raise UsageError(f"{KUBE_API_ENV}={kube_api}: expected an http:// or https:// URL")
    config = optiontable.build(GroupConfig, given, self_name=self_name, kube_api=kube_api)
    # What can be read now is, so a bad file is one line before a daemon starts.
    if isinstance(config.members, MembersFile):
        members.read_member_file(config.members.path)
    signing.read_secret(config.secret_file)
    if config.principal_secret_file is not None:
        signing.read_secret(config.principal_secret_file, "--group-principal-secret-file")
    return config


def _refuse_without(section: str, needed: str, given: dict[str, object]) -> None:
    """Each option of `section` given without the one they all need."""
    for option in optiontable.section(section):
        if option.name != needed and given.get(option.dest) not in (None, ""):
            # (a handover of 0 was given too)
            raise UsageError(f"{option.flag} needs --{needed}")
