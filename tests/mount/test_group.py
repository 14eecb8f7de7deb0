"""A cache group of real mounts: several `pffs mount` processes on 127.0.0.2, .3, ... over one
moto server behind a FaultProxy, each with its own cache directory, joined by a file:// member
list. Each block comes from the store about once across the members, every reader gets exact
bytes, and every failure of a peer (killed, wrong secret) falls back to the store with no
reader error. Small files and 1 MiB blocks keep it quick; nothing here is timed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.testing.faults import FaultProxy
from pffs.testing.servers import MotoServer, free_port
from tests.conftest import metric_value, mounted, run_pffs, stats_snapshot
from tests.waiting import eventually

pytestmark = pytest.mark.mount
MIB = 1 << 20
SECRET = "group-test-secret-0123456789"


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.port, seed=7) as fault_proxy:
        yield fault_proxy


def write_members(path: Path, members: dict[str, str]) -> None:
    """The member file, replaced atomically (a reader never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{name} {url}\n" for name, url in members.items()))
    os.replace(tmp, path)


class Cluster:
    """`count` members on 127.0.0.2.., their member file, secret and mounts."""

    def __init__(self, root: Path, count: int) -> None:
        self.root = root
        self.names = [f"node{n}" for n in range(count)]
        self.addresses = {
            name: (f"127.0.0.{n + 2}", free_port()) for n, name in enumerate(self.names)
        }
        self.urls = {name: f"http://{host}:{port}" for name, (host, port) in self.addresses.items()}
        self.member_file = root / "members"
        write_members(self.member_file, self.urls)
        self.secret = root / "secret"
        self.secret.write_text(SECRET)

    def options(self, name: str, secret: Path | None = None) -> tuple[str, ...]:
        host, port = self.addresses[name]
        return (
            "--group-members",
            f"file://{self.member_file}",
            "--group-listen",
            f"{host}:{port}",
            "--group-secret-file",
            str(secret or self.secret),
            "--group-self",
            name,
            "--block-size",
            "1M",
            "--cache-dir",
            str(self.root / f"cache-{name}"),
        )


@contextlib.contextmanager
def group_mounts(
    cluster: Cluster,
    bucket: str,
    endpoint: str,
    *extra: str,
    secrets: dict[str, Path] | None = None,
) -> Iterator[dict[str, Path]]:
    with contextlib.ExitStack() as stack:
        mounts = {}
        for name in cluster.names:
            options = cluster.options(name, (secrets or {}).get(name))
            mounts[name] = stack.enter_context(
                mounted(
                    f"s3://{bucket}",
                    cluster.root / name,
                    "--endpoint-url",
                    endpoint,
                    *options,
                    *extra,
                )
            )
        yield mounts


def put_files(
    s3, bucket: str, count: int, size: int, seed: int = 1, folder: str = "data"
) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {f"{folder}/f{n:02d}.bin": rng.randbytes(size) for n in range(count)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    return files


def read_all(mnt: Path, files: dict[str, bytes], seed: int, errors: list[str]) -> None:
    names = list(files)
    random.Random(seed).shuffle(names)
    for name in names:
        try:
            data = (mnt / name).read_bytes()
        except OSError as exc:
            errors.append(f"{mnt.name}/{name}: {exc}")
            continue
        if data != files[name]:
            errors.append(f"{mnt.name}/{name}: wrong bytes")


def read_everywhere(mounts: dict[str, Path], files: dict[str, bytes]) -> list[str]:
    errors: list[str] = []
    threads = [
        threading.Thread(target=read_all, args=(mnt, files, seed, errors))
        for seed, mnt in enumerate(mounts.values())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def store_bytes(mounts: dict[str, Path]) -> float:
    return sum(
        metric_value(stats_snapshot(mnt), "pffs_backend_received_bytes_total")
        for mnt in mounts.values()
    )


def peer_bytes(mounts: dict[str, Path], way: str) -> float:
    return sum(
        metric_value(stats_snapshot(mnt), "pffs_group_peer_bytes_total", way=way)
        for mnt in mounts.values()
    )


def test_each_block_comes_from_the_store_about_once(s3, bucket, proxy, tmp_path) -> None:
    files = put_files(s3, bucket, 12, 3 * MIB + 12345)
    dataset = sum(len(data) for data in files.values())
    cluster = Cluster(tmp_path, 3)
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        assert read_everywhere(mounts, files) == []
        from_store = store_bytes(mounts)
        received = peer_bytes(mounts, "received")
        served = peer_bytes(mounts, "served")
        snapshot = stats_snapshot(mounts["node0"])
        view = run_pffs("stats", str(mounts["node0"]), "-n", "1").stdout
    assert metric_value(snapshot, "pffs_group_members") == 3
    # Each block from the store about once (a block owned by a member may be fetched by an
    # asker whose request met a busy owner: allowed, but rare), and most bytes from peers.
    assert dataset <= from_store <= 1.3 * dataset, from_store / dataset
    assert received >= dataset, received / dataset  # 2 of 3 members read each peer block
    assert served == received
    assert "group: 3 members, all up" in view and "from peers" in view, view


def log_of(cluster: Cluster, name: str) -> str:
    return (cluster.root / f"{name}.log").read_text()


def test_sigkill_of_a_member_mid_read_gives_no_error_elsewhere(s3, bucket, proxy, tmp_path) -> None:
    files = put_files(s3, bucket, 16, 2 * MIB + 777)
    # Read only after the kill: every survivor then misses blocks the dead member owns (48
    # blocks over 3 members: all but surely some), so each finds it broken, whatever the
    # readers before the kill happened to ask.
    late = put_files(s3, bucket, 16, 2 * MIB + 5, seed=5, folder="late")
    cluster = Cluster(tmp_path, 3)
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        victim = mounts.pop("node2")
        pid = int(stats_snapshot(victim)["pid"])
        errors: list[str] = []
        some_read = threading.Event()
        names = list(files)

        def reader(mnt: Path, seed: int) -> None:
            order = names[:]
            random.Random(seed).shuffle(order)
            for count, name in enumerate(order):
                if count == 4:
                    some_read.set()
                try:
                    if (mnt / name).read_bytes() != files[name]:
                        errors.append(f"{mnt.name}/{name}: wrong bytes")
                except OSError as exc:
                    errors.append(f"{mnt.name}/{name}: {exc}")

        threads = [
            threading.Thread(target=reader, args=(mnt, seed))
            for seed, mnt in enumerate(mounts.values())
        ]
        for thread in threads:
            thread.start()
        some_read.wait()
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join()
        assert errors == []
        assert read_everywhere(mounts, files) == []  # again, the dead member still listed
        assert read_everywhere(mounts, late) == []
        for name in mounts:
            snapshot = stats_snapshot(mounts[name])
            assert metric_value(snapshot, "pffs_group_member_up", member="node2") == 0
    for name in ("node0", "node1"):
        assert log_of(cluster, name).count("peer node2 broken") == 1, log_of(cluster, name)[-3000:]


def test_a_member_with_the_wrong_secret_is_refused_and_reads_from_the_store(
    s3, bucket, proxy, tmp_path
) -> None:
    files = put_files(s3, bucket, 8, MIB + 99)
    cluster = Cluster(tmp_path, 2)
    wrong = tmp_path / "wrong-secret"
    wrong.write_text("not-the-group-secret-at-all")
    with group_mounts(cluster, bucket, proxy.endpoint_url, secrets={"node1": wrong}) as mounts:
        assert read_everywhere(mounts, files) == []
        assert peer_bytes(mounts, "received") == 0
        refused = metric_value(
            stats_snapshot(mounts["node0"]), "pffs_group_refusals_total", reason="bad signature"
        )
        assert refused >= 1
    # Each asked the other, was refused, and took its blocks from the store: one line each.
    for name, other in (("node0", "node1"), ("node1", "node0")):
        log = log_of(cluster, name)
        assert log.count(f"peer {other} broken (HTTP 403)") == 1, log[-3000:]
        assert log.count(f"({other}?): bad signature") == 1, log[-3000:]


def test_a_malformed_member_file_keeps_the_previous_list(s3, bucket, proxy, tmp_path) -> None:
    files = put_files(s3, bucket, 6, MIB + 5)
    cluster = Cluster(tmp_path, 2)
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        good = cluster.member_file.read_text()
        for bad in ("node0 http://127.0.0.2:1 extra\n", good + good.splitlines()[0] + "\n"):
            cluster.member_file.write_text(bad)
            wait_for_log(cluster, "node0", "keeping the previous member list", bad)
        assert read_everywhere(mounts, files) == []
        assert metric_value(stats_snapshot(mounts["node0"]), "pffs_group_members") == 2
        assert peer_bytes(mounts, "received") > 0  # the group still works on the old list
    log = log_of(cluster, "node0")
    assert log.count("keeping the previous member list") == 2, log[-3000:]
    assert "named twice" in log


def wait_for_log(cluster: Cluster, name: str, text: str, after: str) -> None:
    """Until the member's log says `text` once more (the member file is polled each second)."""
    before = log_of(cluster, name).count(text)
    said = lambda: log_of(cluster, name).count(text) > before  # noqa: E731
    eventually(said, 10, f"{name} saying {text!r} after {after!r}")


class BadPeer:
    """A member that answers block requests wrong, in one of four ways: a stand-in for a broken
    or malicious peer (a real pffs member never answers so), on plain http.server."""

    def __init__(self, host: str, mode: str) -> None:
        import http.server

        from pffs.group import protocol

        self.release = threading.Event()
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                request = protocol.parse_target(self.path)
                length, version = request.length, request.blocks.version
                body = random.randbytes(length)
                footer = protocol.footer(body, bytes(16))  # no secret: no tag
                if mode == "hang":
                    peer.release.wait(30)
                    return
                if mode == "corrupt":
                    body = bytes([body[0] ^ 1]) + body[1:]
                if mode == "version":
                    version = '"another-etag"'
                self.send_response(200)
                self.send_header("content-length", str(length + len(footer)))
                self.send_header(protocol.VERSION, version)
                self.end_headers()
                self.wfile.write(body[: length // 2] if mode == "short" else body + footer)
                if mode == "short":
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("corrupt", "CRC32C mismatch"),
        ("version", "another version"),
        ("short", "short body"),
        ("hang", "timed out"),
    ],
)
def test_a_bad_peer_costs_one_log_line_and_a_fallback(
    mode: str, reason: str, s3, bucket, proxy, tmp_path
) -> None:
    files = put_files(s3, bucket, 6, MIB + 4321)
    dataset = sum(len(data) for data in files.values())
    cluster = Cluster(tmp_path, 1)
    bad = BadPeer("127.0.0.9", mode)
    try:
        write_members(cluster.member_file, {**cluster.urls, "bad": bad.url})
        with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
            assert read_everywhere(mounts, files) == []
            snapshot = stats_snapshot(mounts["node0"])
            assert metric_value(snapshot, "pffs_group_fallbacks_total", reason=reason) >= 1
            assert metric_value(snapshot, "pffs_group_member_up", member="bad") == 0
            assert peer_bytes(mounts, "received") == 0
            assert store_bytes(mounts) >= dataset
    finally:
        bad.close()
    log = log_of(cluster, "node0")
    assert log.count("peer bad broken") == 1 and f"({reason})" in log, log[-3000:]


NOT_MOUNTED = "a source this member does not mount as that principal"


def refusals(mounts: dict[str, Path], reason: str) -> float:
    """Peer requests the members refused for `reason`, in all."""
    return sum(
        metric_value(stats_snapshot(mnt), "pffs_group_refusals_total", reason=reason)
        for mnt in mounts.values()
    )


def test_a_member_serves_only_sources_it_mounts(s3, bucket, proxy, tmp_path) -> None:
    """Two members of one group mounting different buckets: each refuses the other's blocks
    (the group is no way around a bucket's access rules) and both read exact bytes."""
    other = f"{bucket}-b"
    s3.create_bucket(Bucket=other)
    files = {
        bucket: put_files(s3, bucket, 4, MIB + 1),
        other: put_files(s3, other, 4, MIB + 2, seed=2),
    }
    cluster = Cluster(tmp_path, 2)
    with contextlib.ExitStack() as stack:
        mounts = {}
        for name, source in zip(cluster.names, files, strict=True):
            mounts[name] = stack.enter_context(
                mounted(
                    f"s3://{source}",
                    tmp_path / name,
                    "--endpoint-url",
                    proxy.endpoint_url,
                    *cluster.options(name),
                )
            )
        errors: list[str] = []
        read_all(mounts["node0"], files[bucket], 0, errors)
        read_all(mounts["node1"], files[other], 1, errors)
        assert errors == []
        assert refusals(mounts, NOT_MOUNTED) >= 1
        assert peer_bytes(mounts, "received") == 0


def test_a_member_serves_only_the_principal_it_mounts_as(s3, bucket, proxy, tmp_path) -> None:
    """Two members mounting one bucket with different keys: each block key carries the
    principal, so neither serves the other (a store's per-principal rules hold across the
    group), and both read exact bytes from the store themselves."""
    files = put_files(s3, bucket, 4, MIB + 3, seed=3)
    cluster = Cluster(tmp_path, 2)
    with contextlib.ExitStack() as stack:
        mounts = {}
        for number, name in enumerate(cluster.names):
            keys = tmp_path / f"keys-{name}"
            keys.write_text(
                f"[default]\naws_access_key_id = AKIAPEER{number}\n"
                f"aws_secret_access_key = secret{number}\n"
            )
            mounts[name] = stack.enter_context(
                mounted(
                    f"s3://{bucket}",
                    tmp_path / name,
                    "--endpoint-url",
                    proxy.endpoint_url,
                    "--credentials-file",
                    str(keys),
                    *cluster.options(name),
                )
            )
        errors: list[str] = []
        read_all(mounts["node0"], files, 0, errors)
        read_all(mounts["node1"], files, 1, errors)
        assert errors == []
        assert refusals(mounts, NOT_MOUNTED) >= 1
        assert peer_bytes(mounts, "received") == 0


FULL = (
    *("--group-members", "file://M"),
    *("--group-listen", "127.0.0.2:7000"),
    *("--group-secret-file", "S"),
)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (FULL[:2], "needs --group-listen"),
        (FULL[2:4], "--group-listen needs --group-members"),
        (("--group-members", "dns://pffs.svc", *FULL[2:]), "is not dns://NAME:PORT"),
        (("--group-members", "gopher://x", *FULL[2:]), "is not file:///PATH, k8s://"),
        (("--group-members", "file:///nonexistent/m", *FULL[2:]), "No such file"),
        ((*FULL[:2], "--group-listen", "nowhere", *FULL[4:]), "is not HOST:PORT"),
        ((*FULL, "--group-self", "a/b"), "--group-self"),
        ((*FULL[:4], "--group-secret-file", "/nonexistent"), "--group-secret-file"),
        ((*FULL, "--group-handover", "-1"), "is not a number of seconds from 0 to 86400"),
        ((*FULL, "--group-handover", "86401"), "is not a number of seconds from 0 to 86400"),
        (("--group-handover", "0"), "--group-handover needs --group-members"),
    ],
)
def test_bad_group_options(options: tuple[str, ...], fragment: str, tmp_path: Path) -> None:
    from tests.mount.test_cli_errors import assert_one_line_error

    members, secret = tmp_path / "members", tmp_path / "secret"
    members.write_text("a http://127.0.0.2:7000\n")
    secret.write_text(SECRET)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    options = tuple(
        f"file://{members}" if o == "file://M" else str(secret) if o == "S" else o for o in options
    )
    assert_one_line_error(("mount", "s3://b", str(mnt), *options), 2, fragment)


def test_a_taken_peer_port_is_one_line(s3, bucket, moto, tmp_path) -> None:
    from tests.mount.test_cli_errors import assert_one_line_error

    cluster = Cluster(tmp_path, 1)
    host, port = cluster.addresses["node0"]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with socket.socket() as taken:
        taken.bind((host, port))
        taken.listen()
        args = ("mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url)
        assert_one_line_error((*args, *cluster.options("node0")), 1, "--group-listen")


def test_warmup_on_one_member_fills_the_group(s3, bucket, proxy, tmp_path) -> None:
    """`pffs warmup` on node0 asks each block's owner: the owners load their blocks from the
    store, so the other members then read the whole dataset without the store."""
    files = put_files(s3, bucket, 9, MIB + 321)
    cluster = Cluster(tmp_path, 3)
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        result = run_pffs("warmup", str(mounts["node0"] / "data"), "--quiet")
        assert result.returncode == 0, result.stderr
        owners = {name: stats_snapshot(mounts[name]) for name in ("node1", "node2")}
        for snapshot in owners.values():  # each owner loaded its share for the warmup
            assert metric_value(snapshot, "pffs_group_peer_bytes_total", way="served") > 0
        before = {
            name: metric_value(s, "pffs_backend_received_bytes_total") for name, s in owners.items()
        }
        others = {name: mounts[name] for name in owners}
        assert read_everywhere(others, files) == []
        after = {
            name: metric_value(stats_snapshot(mounts[name]), "pffs_backend_received_bytes_total")
            for name in owners
        }
        assert after == before  # every block came from a member's cache


def test_a_member_joining_takes_blocks_from_their_previous_owners(
    s3, bucket, proxy, tmp_path
) -> None:
    """node2 joins a group of two that read the dataset: the blocks it now owns come from
    their previous owners (the handover), not the store, for it and for the others."""
    files = put_files(s3, bucket, 10, MIB + 11)
    cluster = Cluster(tmp_path, 3)
    write_members(cluster.member_file, {n: cluster.urls[n] for n in ("node0", "node1")})
    with contextlib.ExitStack() as stack:
        mounts = {
            name: stack.enter_context(
                mounted(
                    f"s3://{bucket}", tmp_path / name,
                    "--endpoint-url", proxy.endpoint_url, *cluster.options(name),
                )
            )
            for name in ("node0", "node1")
        }  # fmt: skip
        assert read_everywhere(mounts, files) == []
        before = store_bytes(mounts)
        write_members(cluster.member_file, cluster.urls)
        for name in mounts:  # each polls the file every second
            joined = lambda name=name: "joined node2" in log_of(cluster, name)  # noqa: E731
            eventually(joined, 10, f"{name} joined node2")
            assert log_of(cluster, name).count("joined node2") == 1  # one line per change
        mounts["node2"] = stack.enter_context(
            mounted(
                f"s3://{bucket}", tmp_path / "node2",
                "--endpoint-url", proxy.endpoint_url, *cluster.options("node2"),
            )
        )  # fmt: skip
        assert read_everywhere(mounts, files) == []
        assert store_bytes(mounts) == before
        assert peer_bytes({"node2": mounts["node2"]}, "received") > 0
