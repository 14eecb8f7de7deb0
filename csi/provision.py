"""Dynamic provisioning on S3: a volume is a new prefix under a StorageClass's base.

CreateVolume(name) makes `<baseSource>/<name>/` with a directory marker object whose metadata
records the name, the parameters and the capacity asked for: a repeat with the same name finds
the marker and answers the same volume (or ALREADY_EXISTS when the parameters differ). The
volume id is the volume's source URL, plus the endpoint and region as a query when set, e.g.
`s3://bucket/base/pvc-1?endpoint=http%3A%2F%2Fminio%3A9000`, so DeleteVolume can find it with
nothing but the id. StorageClass parameters:

    baseSource      s3://bucket[/prefix] under which volumes are made (REQUIRED)
    endpoint        S3-compatible endpoint URL
    region          region
    deleteOnDelete  "true": DeleteVolume deletes every object of the volume; "false" (default)
                    keeps the data and removes only the marker
    cacheMemory, cacheSize, readaheadMax, blockSize, readOnly
                    passed to the node in the volume context (see pffs.csi.params)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import grpc

from pffs.csi.params import K8S_PREFIX, SIZE_KEYS, check_source, parse_bool, volume_spec
from pffs.csi.status import CsiError, invalid

T = TypeVar("T")

NODE_KEYS = frozenset({"readOnly", *SIZE_KEYS})
PARAMETER_KEYS = frozenset({"baseSource", "endpoint", "region", "deleteOnDelete", *NODE_KEYS})
META_NAME, META_PARAMETERS, META_CAPACITY = "pffs-volume-name", "pffs-parameters", "pffs-capacity"
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
MAX_SEGMENT = 200


@dataclass(frozen=True)
class VolumeRef:
    """Where a provisioned volume lives: all that its volume id says."""

    source: str  # s3://bucket/base/name
    endpoint: str | None = None
    region: str | None = None

    @property
    def bucket(self) -> str:
        return urlsplit(self.source).netloc

    @property
    def prefix(self) -> str:
        return urlsplit(self.source).path.strip("/")

    @property
    def marker_key(self) -> str:
        return f"{self.prefix}/"

    def volume_id(self) -> str:
        query = {k: v for k, v in (("endpoint", self.endpoint), ("region", self.region)) if v}
        return f"{self.source}?{urlencode(query)}" if query else self.source

    @classmethod
    def parse(cls, volume_id: str) -> VolumeRef | None:
        """The reference in a volume id, or None when the id is not one this driver made."""
        parts = urlsplit(volume_id)
        if parts.scheme != "s3" or not parts.netloc or not parts.path.strip("/"):
            return None
        query = dict(parse_qsl(parts.query))
        if set(query) - {"endpoint", "region"}:
            return None
        return cls(
            source=f"s3://{parts.netloc}{parts.path}".rstrip("/"),
            endpoint=query.get("endpoint"),
            region=query.get("region"),
        )

    def volume_context(self, parameters: dict[str, str]) -> dict[str, str]:
        context = {"source": self.source}
        if self.endpoint:
            context["endpoint"] = self.endpoint
        if self.region:
            context["region"] = self.region
        context.update({k: v for k, v in parameters.items() if k in NODE_KEYS})
        return context


def segment_for(name: str) -> str:
    """The prefix segment of a CO volume name: the name itself where it is a safe key part."""
    safe = SAFE_NAME.sub("-", name)[:MAX_SEGMENT]
    if safe != name or safe in ("", ".", ".."):
        # Two names that clean up alike must still get two prefixes.
        safe = f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return safe


def storage_parameters(parameters: dict[str, str]) -> dict[str, str]:
    """The StorageClass parameters checked; Kubernetes' own csi.storage.k8s.io/ keys dropped."""
    own = {k: v for k, v in parameters.items() if not k.startswith(K8S_PREFIX)}
    unknown = sorted(set(own) - PARAMETER_KEYS)
    if unknown:
        known = ", ".join(sorted(PARAMETER_KEYS))
        raise invalid(f"unknown parameter {unknown[0]!r} (known: {known})")
    base = own.get("baseSource", "").strip().rstrip("/")
    if not base:
        raise invalid("the parameter 'baseSource' (s3://bucket[/prefix]) is required")
    check_source(base, "baseSource")
    parse_bool("deleteOnDelete", own.get("deleteOnDelete", "false"))
    own["baseSource"] = base
    # The node's attributes are checked here already, so a bad StorageClass fails at once.
    volume_spec({"source": base, **{k: v for k, v in own.items() if k in NODE_KEYS}})
    return own


class S3Store:
    """The few S3 calls provisioning needs, with the request's own credentials."""

    def __init__(self, ref: VolumeRef, secrets: dict[str, str]) -> None:
        import boto3
        from botocore.config import Config

        from pffs.csi.params import volume_credentials

        credentials = volume_credentials(secrets)
        session = boto3.session.Session(
            aws_access_key_id=credentials.access_key_id if credentials else None,
            aws_secret_access_key=credentials.secret_access_key if credentials else None,
            aws_session_token=credentials.session_token if credentials else None,
        )
        config = Config(
            region_name=ref.region or session.region_name or "us-east-1",
            connect_timeout=10,
            read_timeout=30,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path" if ref.endpoint else "auto"},
        )
        try:
            self.client = session.client("s3", endpoint_url=ref.endpoint, config=config)
        except ValueError as exc:
            raise invalid(f"bad endpoint {ref.endpoint!r}: {exc}") from None
        self.ref = ref

    def marker(self) -> dict[str, str] | None:
        """The volume's marker metadata, or None when there is no such volume."""
        try:
            head = self._call(
                lambda: self.client.head_object(Bucket=self.ref.bucket, Key=self.ref.marker_key)
            )
        except CsiError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        metadata: dict[str, str] = head.get("Metadata", {})
        return metadata if META_NAME in metadata else None

    def create_marker(self, name: str, parameters: dict[str, str], capacity: int) -> None:
        metadata = {
            META_NAME: quote(name),
            META_PARAMETERS: quote(json.dumps(parameters, sort_keys=True)),
            META_CAPACITY: str(capacity),
        }
        self._call(
            lambda: self.client.put_object(
                Bucket=self.ref.bucket, Key=self.ref.marker_key, Body=b"", Metadata=metadata
            )
        )

    def delete(self, everything: bool) -> int:
        """Delete the marker, or every object under the volume's prefix; returns the count."""
        if not everything:
            self._call(
                lambda: self.client.delete_object(Bucket=self.ref.bucket, Key=self.ref.marker_key)
            )
            return 1
        return int(self._call(self._delete_all))

    def _delete_all(self) -> int:
        deleted = 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.ref.bucket, Prefix=self.ref.marker_key):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:  # a page holds at most 1000 keys, the limit of one DeleteObjects
                self.client.delete_objects(
                    Bucket=self.ref.bucket, Delete={"Objects": keys, "Quiet": True}
                )
                deleted += len(keys)
        return deleted

    def _call(self, fn: Callable[[], T]) -> T:
        import botocore.exceptions

        where = f"s3://{self.ref.bucket}" + (
            f" at {self.ref.endpoint}" if self.ref.endpoint else ""
        )
        try:
            return fn()
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code == "NoSuchBucket":
                raise CsiError(
                    grpc.StatusCode.FAILED_PRECONDITION, f"the bucket of {where} does not exist"
                ) from None
            if code in ("404", "NoSuchKey", "NotFound"):
                raise CsiError(grpc.StatusCode.NOT_FOUND, f"not found in {where}") from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise CsiError(
                    grpc.StatusCode.PERMISSION_DENIED, f"access to {where} denied ({code})"
                ) from None
            raise CsiError(grpc.StatusCode.INTERNAL, f"{where}: {code or exc}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise CsiError(grpc.StatusCode.UNAVAILABLE, f"{where}: {exc}") from None


def decode_marker(metadata: dict[str, str]) -> tuple[str, dict[str, str], int]:
    """(name, parameters, capacity) recorded in a marker."""
    name = unquote(metadata.get(META_NAME, ""))
    try:
        parameters = json.loads(unquote(metadata.get(META_PARAMETERS, "{}")))
        capacity = int(metadata.get(META_CAPACITY, "0"))
    except ValueError:
        parameters, capacity = {}, 0
    return name, parameters, capacity
