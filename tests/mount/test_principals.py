"""Mounts of one bucket with different credentials over one cache directory share nothing.

Real `pffs mount` processes, one after the other over the same `--cache-dir`. On moto (which
lets every key read everything) the sharing shows in the requests the store serves: a mount
with other keys fetches what the first cached. On Ceph's RADOS Gateway, a store that enforces
access, a bucket policy denies the second user `secret/*`: after the first user's mount has
read and cached secret/plan.txt, the second user's mount gets EACCES for it, never its bytes,
while it lists it and reads every other key.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from pathlib import Path

import boto3
import pytest

from pffs.testing.rgw import RgwCluster
from pffs.testing.servers import MotoServer
from tests.conftest import mounted

pytestmark = [pytest.mark.mount]
SECRET = b"top secret: the plan\n"
PUBLIC = b"anyone may read this\n"


def _env(keys: tuple[str, str]) -> dict[str, str]:
    return {**os.environ, "AWS_ACCESS_KEY_ID": keys[0], "AWS_SECRET_ACCESS_KEY": keys[1]}


def _entries(cache: Path) -> list[Path]:
    return list(cache.rglob("*.val"))


def test_two_keys_share_no_block_of_one_cache_directory(
    counted: MotoServer, tmp_path: Path
) -> None:
    s3 = boto3.client("s3", endpoint_url=counted.endpoint_url)
    s3.create_bucket(Bucket="shared")
    data = os.urandom(5 << 20)  # two blocks
    s3.put_object(Bucket="shared", Key="data.bin", Body=data)
    cache = tmp_path / "cache"
    options = ("--endpoint-url", counted.endpoint_url, "--cache-dir", str(cache))
    alice, bob = _env(("AKIAALICE", "alice-secret")), _env(("AKIABOB", "bob-secret"))

    def read_as(env: dict[str, str]) -> int:
        """GETs of the object the store served for one mount reading it whole."""
        before = counted.requests("GET", "/shared/data.bin")
        with mounted("s3://shared", tmp_path / "mnt", *options, env=env) as mnt:
            assert (mnt / "data.bin").read_bytes() == data
        return counted.requests("GET", "/shared/data.bin") - before

    assert read_as(alice) > 0
    assert _entries(cache)
    assert read_as(bob) > 0  # nothing of alice's blocks: fetched again
    assert read_as(alice) == 0  # alice's own are still there, and served
    assert read_as(bob) == 0  # and now bob's


def _allow_bob_but_secret(bucket: str, bob: str) -> str:
    """As REFERENCE's access control: bob lists the bucket and gets its objects, but not
    secret/*."""
    principal = {"AWS": [f"arn:aws:iam:::user/{bob}"]}
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": principal,
                "Action": ["s3:ListBucket", "s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            },
            {
                "Effect": "Deny",
                "Principal": principal,
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/secret/*"],
            },
        ],
    })  # fmt: skip


def test_a_denied_principal_gets_eacces_never_the_bytes_another_cached(
    rgw: RgwCluster, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    alice_uid, bob_uid, bucket = f"alice-{tag}", f"bob-{tag}", f"plans-{tag}"
    alice, bob = rgw.create_user(alice_uid), rgw.create_user(bob_uid)
    owner = boto3.client(
        "s3",
        endpoint_url=rgw.endpoint,
        aws_access_key_id=alice[0],
        aws_secret_access_key=alice[1],
        region_name="us-east-1",
    )
    owner.create_bucket(Bucket=bucket)
    owner.put_object(Bucket=bucket, Key="secret/plan.txt", Body=SECRET)
    owner.put_object(Bucket=bucket, Key="public/readme.txt", Body=PUBLIC)
    owner.put_bucket_policy(Bucket=bucket, Policy=_allow_bob_but_secret(bucket, bob_uid))
    cache = tmp_path / "cache"
    options = ("--endpoint-url", rgw.endpoint, "--cache-dir", str(cache))

    with mounted(f"s3://{bucket}", tmp_path / "alice", *options, env=_env(alice)) as mnt:
        assert (mnt / "secret" / "plan.txt").read_bytes() == SECRET
    assert _entries(cache)  # the secret's block is in the shared directory

    with mounted(f"s3://{bucket}", tmp_path / "bob", *options, env=_env(bob)) as mnt:
        # Bob may list it: the open takes the listing's attributes without asking the store,
        # and the bytes must still come from the store (a GET), which refuses them.
        assert os.listdir(mnt / "secret") == ["plan.txt"]
        assert (mnt / "secret" / "plan.txt").stat().st_size == len(SECRET)
        for _attempt in range(2):  # and again, once anything could have been cached
            with pytest.raises(PermissionError) as refused:
                (mnt / "secret" / "plan.txt").read_bytes()
            assert refused.value.errno == errno.EACCES
        assert (mnt / "public" / "readme.txt").read_bytes() == PUBLIC

    # With no metadata kept, the open asks the store (a HEAD), which refuses it too.
    fresh = (*options, "--metadata-ttl", "0")
    with mounted(f"s3://{bucket}", tmp_path / "bob", *fresh, env=_env(bob)) as mnt:
        with pytest.raises(PermissionError) as refused:
            (mnt / "secret" / "plan.txt").read_bytes()
        assert refused.value.errno == errno.EACCES
        assert (mnt / "public" / "readme.txt").read_bytes() == PUBLIC

    # The store itself answers alice's keys with the bytes and bob's with AccessDenied: the
    # refusal above is the store's, not a mount that cannot read at all.
    with mounted(f"s3://{bucket}", tmp_path / "alice", *options, env=_env(alice)) as mnt:
        assert (mnt / "secret" / "plan.txt").read_bytes() == SECRET
