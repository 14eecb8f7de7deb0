"""A store that stops answering mid-session, then answers again (docs/RELIABILITY.md's drill).

A real `pffs mount` reads moto's S3 server through the fault proxy, which hangs (reads every
request, answers none) and later resumes. With the default timeouts, or the same ratios scaled
down: the first read needing the store gets EIO within --retry-timeout + --request-timeout;
from then on every request that needs the store (an uncached read, an open of a file whose
attributes expired, `ls` and `stat` of an expired directory and entry, a name never seen)
fails or is served from what was last seen, at once; once the store answers, the mount reads
exact bytes of a file it never read within seconds, with no remount, and no request goes on a
connection that was open while it hung, nor takes the request timeout (issue 49).

Each drill runs with each fate of the connections open while the store hung (the proxy's
`held`): answered again, reset, or kept as black holes for good, as an L4 load balancer or a
NAT keeps connections bound to a backend that died.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.testing.faults import HELD, FaultProxy
from pffs.testing.servers import MotoServer
from tests.conftest import mounted
from tests.mount.test_failures import source_up
from tests.mount.test_reliability import beyond_a_tree_page, errno_of, read_all, when_back

pytestmark = pytest.mark.mount
MIB = 1 << 20
# The defaults (pffs.config): retry budget, request, connect timeouts and the metadata TTLs.
DEFAULTS = {"retry": 60.0, "request": 30.0, "connect": 10.0, "ttl": 60.0}
# A loaded machine's delay on top of a configured wait; the failures these bounds catch are a
# hang, or a wait of the default request timeout (30 s).
SLACK = 10.0
# Once the store answers again, the mount reads exact bytes within this.
BACK = 15.0


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.port) as fault_proxy:
        yield fault_proxy


def drill(
    s3, bucket: str, proxy: FaultProxy, mnt: Path, scale: float, held: str
) -> dict[str, float]:
    """The drill with every timeout and TTL at `scale` times its default, the connections open
    while the store hung `held` at its return; the seconds each step took, by name. Asserts
    what must hold whatever the timings."""
    retry, request, connect, ttl = (DEFAULTS[k] * scale for k in DEFAULTS)
    files = {f"d/{name}.bin": random.randbytes(MIB + n) for n, name in enumerate("abc")}
    files["e/x.bin"] = random.randbytes(MIB)
    files["f/y.bin"] = random.randbytes(MIB)  # f is never listed: y.bin never seen
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    beyond_a_tree_page(s3, bucket)
    options: tuple[str, ...] = (
        *("--retry-timeout", f"{retry:g}", "--request-timeout", f"{request:g}"),
        *("--connect-timeout", f"{connect:g}", "--metadata-ttl", f"{ttl:g}"),
        *("--cache-dir", "none"),
    )
    if scale != 1:  # a GET that waits out the request timeout is logged (at 1: 5 s does it)
        options += ("--slow-request", f"{request / 3:g}")
    took: dict[str, float] = {}
    with mounted(f"s3://{bucket}", mnt, "--endpoint-url", proxy.endpoint_url, *options):
        assert sorted(os.listdir(mnt / "d")) == ["a.bin", "b.bin", "c.bin"]
        assert os.listdir(mnt / "e") == ["x.bin"]
        assert (mnt / "d" / "a.bin").read_bytes() == files["d/a.bin"]
        listed_at = time.monotonic()
        proxy.hang()
        code, took["first read (EIO)"] = errno_of(read_all, mnt / "d" / "b.bin")
        assert code == errno.EIO, code
        assert source_up(mnt) == 0
        asked_while_down = len(proxy.requests)
        time.sleep(max(0.0, listed_at + ttl + 0.5 - time.monotonic()))  # the TTLs run out
        started = time.monotonic()
        assert sorted(os.listdir(mnt / "d")) == ["a.bin", "b.bin", "c.bin"]
        took["ls of an expired directory"] = time.monotonic() - started  # as last seen
        started = time.monotonic()
        assert (mnt / "e" / "x.bin").stat().st_size == len(files["e/x.bin"])
        took["stat of an expired entry"] = time.monotonic() - started
        code, took["read of another file"] = errno_of(read_all, mnt / "d" / "c.bin")
        assert code == errno.EIO, code
        code, took["stat of a name never seen"] = errno_of(os.stat, mnt / "f" / "y.bin")
        assert code == errno.EIO, code
        started = time.monotonic()
        assert (mnt / "d" / "a.bin").read_bytes() == files["d/a.bin"]  # cached
        took["read of a cached file"] = time.monotonic() - started
        # Answered at once: while down, the store is asked nothing but the breaker's probes
        # (a one-key LIST), whatever the machine's speed.
        asked = [r for r in proxy.requests[asked_while_down:] if "max-keys=1" not in r[1]]
        assert not asked, asked
        proxy.resume(held)
        started = time.monotonic()
        assert when_back(Path.read_bytes, mnt / "d" / "b.bin", within=60) == files["d/b.bin"]
        took["back: exact bytes after"] = time.monotonic() - started
        assert source_up(mnt) == 1
        for key, data in files.items():
            assert (mnt / key).read_bytes() == data, key
    print(json.dumps({"scale": scale, "held": held, **{k: round(v, 2) for k, v in took.items()}}))
    assert proxy.injected["hang"] > 0
    assert proxy.reused_after_hang == 0  # no connection that hung carried another request
    assert proxy.used_after_hang == 0  # nor any connection open while it hung
    log = (mnt.parent / f"{mnt.name}.log").read_text()
    assert log.count(" is down: ") == 1 and log.count(" is up again ") == 1, log[-3000:]
    after = log[log.index(" is up again ") :]
    # No request after it (a GET, or boto3's HEAD of a name never seen) waited out a timeout.
    slow = [float(t) for t in re.findall(r"slow store request: \S+ took ([0-9.]+)s", after)]
    assert all(seconds < request * 0.9 for seconds in slow), (slow, after[-3000:])
    assert took["first read (EIO)"] < retry + request + SLACK
    assert took["back: exact bytes after"] < BACK, took
    return took


@pytest.mark.parametrize("held", HELD)
def test_store_hangs_then_answers_scaled(s3, bucket, proxy, tmp_path, held: str) -> None:
    """The drill with the defaults' ratios, every timeout and TTL a twentieth of its default
    (3 s retry budget, 1.5 s request timeout)."""
    drill(s3, bucket, proxy, tmp_path / "mnt", 1 / 20, held)


@pytest.mark.slow
def test_store_hangs_then_answers_with_the_default_options(s3, bucket, proxy, tmp_path) -> None:
    """The drill at the real defaults: a 60 s retry budget, 30 s requests, 60 s TTLs (about
    a minute, most of it the first read's bound), with the connections open while the store
    hung kept as black holes: the fate that cost a reused one the whole request timeout. The
    other two fates at the defaults are in docs/notes/store-down.md (a minute each: the suite
    runs them scaled)."""
    drill(s3, bucket, proxy, tmp_path / "mnt", 1.0, "black hole")
