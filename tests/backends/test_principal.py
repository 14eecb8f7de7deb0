"""Who each backend reads as (backends/principal.py), and the S3 source id naming the endpoint
the client really uses. Backends are built for real (boto3 sessions from the environment and
config files, a moto server over HTTP); a role is never assumed: naming it must not need STS,
which points at a closed port here so that any call to it fails the test."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.backends import open_backend
from pffs.backends.hdfs import HdfsBackend
from pffs.backends.principal import (
    ccache_principal,
    hdfs_principal,
    local_principal,
    principal_digest,
)
from pffs.config import SourceConfig
from pffs.errors import PffsError
from pffs.testing.servers import MotoServer, free_port


@pytest.fixture
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No credentials, endpoint or profile from the test session; config files of the test's
    own (written to the returned directory); STS and the instance metadata unreachable."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    yield tmp_path


def _principal(url: str = "s3://bucket", **settings: str) -> str:
    return open_backend(SourceConfig(url=url, **settings)).principal  # type: ignore[arg-type]


def _keys(monkeypatch: pytest.MonkeyPatch, key: str, secret: str) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)


def test_keys_name_the_principal_and_never_show_in_it(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys(monkeypatch, "AKIAALICE", "alice-secret")
    alice = _principal()
    assert alice == _principal("s3://bucket/other-prefix")  # the same principal anywhere
    assert "AKIAALICE" not in alice and "alice-secret" not in alice
    _keys(monkeypatch, "AKIABOB", "bob-secret")
    assert _principal() != alice
    # Another tenant's key id with a secret that is not its own is not its principal.
    _keys(monkeypatch, "AKIAALICE", "guessed")
    assert _principal() != alice


def test_a_profile_s_keys_name_the_principal(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (aws_env / "credentials").write_text(
        "[alice]\naws_access_key_id = AKIAALICE\naws_secret_access_key = alice-secret\n"
        "[bob]\naws_access_key_id = AKIABOB\naws_secret_access_key = bob-secret\n"
    )
    alice = _principal(profile="alice")
    assert alice != _principal(profile="bob")
    _keys(monkeypatch, "AKIAALICE", "alice-secret")
    assert _principal() == alice  # the same keys from the environment: the same principal


def test_an_assumed_role_is_named_without_calling_sts(aws_env: Path) -> None:
    (aws_env / "credentials").write_text(
        "[base]\naws_access_key_id = AKIABASE\naws_secret_access_key = base-secret\n"
    )
    (aws_env / "config").write_text(
        "[profile reader]\nrole_arn = arn:aws:iam::111122223333:role/reader\n"
        "source_profile = base\n"
        "[profile admin]\nrole_arn = arn:aws:iam::111122223333:role/admin\n"
        "source_profile = base\n"
    )
    reader = _principal(profile="reader")  # STS is a closed port: a call would fail here
    assert reader != _principal(profile="admin")
    assert reader != _principal(profile="base")
    assert reader == _principal(profile="reader")


def test_a_web_identity_is_named_by_its_role(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = aws_env / "token"
    token.write_text("eyJ.not-a-real.token")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/team-a")
    team_a = _principal()
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/team-b")
    assert _principal() != team_a


def test_no_credentials_is_a_principal_of_its_own(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    anonymous = _principal()
    _keys(monkeypatch, "AKIAALICE", "alice-secret")
    assert _principal() != anonymous


@pytest.mark.parametrize("how", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "profile"])
def test_the_source_id_names_the_endpoint_the_client_uses(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch, moto: MotoServer, s3, bucket: str, how: str
) -> None:
    """An endpoint set outside pffs is the one its requests go to, and the one its source id
    (and so its cache keys) names."""
    _keys(monkeypatch, "pffs-test", "pffs-test-secret")
    if how == "profile":
        (aws_env / "config").write_text(f"[default]\nendpoint_url = {moto.endpoint_url}\n")
    else:
        monkeypatch.setenv(how, moto.endpoint_url)
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"from moto")
    backend = open_backend(SourceConfig(url=f"s3://{bucket}"))
    assert backend.source_id == f"s3://{bucket}@{moto.endpoint_url}"
    backend.check()
    assert backend.read_range("a.txt", 0, 100, None) == b"from moto"


def test_aws_s_own_endpoint_leaves_the_source_id_bare(aws_env: Path) -> None:
    assert open_backend(SourceConfig(url="s3://bucket/pre")).source_id == "s3://bucket/pre"


def _ccache(realm: str, *components: str) -> bytes:
    """An MIT Kerberos FILE ticket cache of version 4 holding only its default principal."""
    header = struct.pack(">HHII", 1, 8, 0, 0)  # one tag: the KDC time offset
    words = [realm, *components]
    principal = struct.pack(">II", 1, len(components)) + b"".join(
        struct.pack(">I", len(word)) + word.encode() for word in words
    )
    return b"\x05\x04" + struct.pack(">H", len(header)) + header + principal


def test_hdfs_names_the_user_and_the_kerberos_principal(tmp_path: Path) -> None:
    alice, bob = tmp_path / "krb5cc_alice", tmp_path / "krb5cc_bob"
    alice.write_bytes(_ccache("EXAMPLE.COM", "alice", "node1"))
    bob.write_bytes(_ccache("EXAMPLE.COM", "bob"))
    assert ccache_principal(str(alice)) == "alice/node1@EXAMPLE.COM"
    assert ccache_principal(str(bob)) == "bob@EXAMPLE.COM"
    assert hdfs_principal("u", str(alice), {}) != hdfs_principal("u", str(bob), {})
    # The ticket's principal, wherever the cache is, however it is named.
    moved = tmp_path / "elsewhere"
    moved.write_bytes(alice.read_bytes())
    assert hdfs_principal("u", f"FILE:{moved}", {}) == hdfs_principal("u", str(alice), {})
    assert hdfs_principal("u", None, {"KRB5CCNAME": str(alice)}) == hdfs_principal(
        "u", str(alice), {}
    )
    # The user counts too, Kerberos or not: a ticket never joins two users.
    assert hdfs_principal("u", str(alice), {}) != hdfs_principal("v", str(alice), {})
    assert hdfs_principal("alice", None, {}) != hdfs_principal("bob", None, {})
    assert hdfs_principal(None, None, {"HADOOP_USER_NAME": "bob"}) == hdfs_principal(
        "bob", None, {}
    )
    # A file that is no ticket cache is never read as one: it is named by where it is.
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x05\x04\xff\xff")
    assert ccache_principal(str(garbage)) is None
    assert ccache_principal(str(tmp_path / "missing")) is None
    assert hdfs_principal("u", str(garbage), {}) != hdfs_principal("u", str(moved), {})


def test_an_hdfs_backend_carries_its_principal() -> None:
    alice = HdfsBackend(SourceConfig(url="hdfs://nn:8020/data", hdfs_user="alice"), env={})
    bob = HdfsBackend(SourceConfig(url="hdfs://nn:8020/data", hdfs_user="bob"), env={})
    assert alice.source_id == bob.source_id
    assert alice.principal != bob.principal


def _principal_as_nobody() -> str:
    """local_principal() in a child process that dropped to nobody (uid and gid 65534)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, local_principal().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        return os.read(read_end, 256).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_local_files_are_read_as_the_process_s_user(tmp_path: Path) -> None:
    """A process of another uid is another principal of the same file:// source."""
    root = open_backend(SourceConfig(url=f"file://{tmp_path}"))
    assert root.principal == open_backend(SourceConfig(url=f"arrow+file://{tmp_path}")).principal
    if os.geteuid() != 0:
        pytest.skip("running as another user needs root")
    nobody = _principal_as_nobody()
    assert len(nobody) == len(root.principal)
    assert nobody != root.principal


def test_the_digest_separates_its_parts() -> None:
    assert principal_digest("s3", "ab", "c") != principal_digest("s3", "a", "bc")
    assert principal_digest("s3", "x") != principal_digest("hdfs", "x")


def _proof_key(url: str = "s3://bucket", profile: str | None = None) -> bytes | None:
    return open_backend(SourceConfig(url=url, profile=profile)).principal_key


def test_only_static_keys_give_a_key_that_proves_the_principal(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proof key (pffs.group.principals) comes from the secret key: a guessed secret with
    the right key id gives another; a role or no credentials give none (no STS call)."""
    assert _proof_key() is None  # anonymous
    _keys(monkeypatch, "AKIAALICE", "alice-secret")
    alice = _proof_key()
    assert alice is not None and b"alice-secret" not in alice
    assert _proof_key("s3://other-bucket") == alice
    _keys(monkeypatch, "AKIAALICE", "guessed")
    assert _proof_key() not in (None, alice)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "temporary")
    assert _proof_key() is None  # temporary keys: not a static credential
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (aws_env / "credentials").write_text(
        "[base]\naws_access_key_id = AKIABASE\naws_secret_access_key = base-secret\n"
    )
    (aws_env / "config").write_text(
        "[profile reader]\nrole_arn = arn:aws:iam::111122223333:role/reader\n"
        "source_profile = base\n"
    )
    assert _proof_key(profile="reader") is None


def test_every_s3_read_is_pinned_to_its_version(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch, moto: MotoServer, s3, bucket: str
) -> None:
    """A version without quotes (as a peer may send it) still pins the read: the same ETag
    unquoted reads it, anything else is refused, never read unpinned."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pffs-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pffs-test-secret")
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"pinned bytes")
    etag = s3.head_object(Bucket=bucket, Key="a.txt")["ETag"]
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=moto.endpoint_url))
    assert backend.read_range("a.txt", 0, 6, etag) == b"pinned"
    assert backend.read_range("a.txt", 0, 6, etag.strip('"')) == b"pinned"
    for other in ("1700000000000000000:12", '"another-etag"'):
        with pytest.raises(PffsError):
            backend.read_range("a.txt", 0, 6, other)
