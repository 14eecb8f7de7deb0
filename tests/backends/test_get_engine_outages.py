"""The lean GET engine (backends/s3get.py) through a store's outage, on moto behind a
FaultProxy: no connection that hung carries a request after it, a source back up lets go of
every connection opened before (whatever the proxy does with those it held), and a new
connection waits for its first answer only the probe's timeout. The engine's other outcomes
are in test_get_engine.py, whose fixtures these share.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from pffs.backends.s3errors import S3RequestFailed, Unanswered
from pffs.backends.s3get import PROBE_ANSWER_TIMEOUT
from pffs.errors import Transient
from pffs.retry import RetryTerms
from pffs.testing.faults import HELD, FaultProxy
from tests.backends.test_get_engine import DATA, QUICK_RETRIES, _backend, proxy, stored
from tests.waiting import eventually

__all__ = ["proxy", "stored"]  # the fixtures, shared with the engine's other tests


def test_after_a_hang_no_connection_that_hung_is_used_and_probes_time_out_on_their_own(
    proxy: FaultProxy, stored: tuple[str, str]
) -> None:
    """The store stops answering: a GET times out after the request timeout and its
    connection is closed; a probe gives up after its own short timeout, far below the request
    timeout; once the store answers, the next GET and probe are served on connections opened
    since, none that carried a request while it hung."""
    bucket, _ = stored
    backend = _backend(proxy.endpoint_url, bucket, read_timeout=0.5)
    assert backend.read_range("data", 0, 10, None) == DATA[:10]  # a pooled connection
    probing_timeout = 30.0
    probing = _backend(proxy.endpoint_url, bucket, read_timeout=probing_timeout)
    proxy.hang()
    try:
        with pytest.raises(Transient, match="read timed out"):
            backend.read_range("data", 0, 10, None)
        started = time.monotonic()
        with pytest.raises(Transient):
            probing.probe()
        took = time.monotonic() - started
        # Its own answer timeout (3 s), not the request's 30 s: a bound at the request timeout,
        # ten times the probe's, which no load reaches (not a speed check).
        assert took < probing_timeout, took
    finally:
        proxy.resume()
    assert proxy.injected["hang"] == QUICK_RETRIES.attempts + 1
    probing.probe()
    assert backend.read_range("data", 10, 10, None) == DATA[10:20]
    assert proxy.reused_after_hang == 0


@pytest.mark.parametrize("held", HELD)
def test_once_the_source_is_back_no_connection_open_before_carries_a_request(
    proxy: FaultProxy, stored: tuple[str, str], held: str
) -> None:
    """Issue 49: the proxy hangs, then answers again and keeps every connection it held (both
    the pooled one that answered and the spare) as it says: answered, reset, or black holes
    for good. Terms that say the source came back up make the backend let go of them all: the
    next read goes on a new connection at once, and the spare is opened again, in that
    connection's generation."""
    bucket, _ = stored
    backend = _backend(proxy.endpoint_url, bucket, read_timeout=30.0)
    assert backend.read_range("data", 0, 10, None) == DATA[:10]  # a pooled one, and a spare
    connections = backend.engine._target.connections
    # the spare, opened in its own thread
    eventually(lambda: len(connections._idle) >= 2, 5, "a spare connection")
    proxy.hang()
    proxy.resume(held)
    back = RetryTerms(recovered=1)
    assert backend.read_range("data", 10, 10, None, terms=back) == DATA[10:20]
    # On a new connection at once: none of those held (a black hole would have cost the
    # request timeout, then a retry) carried it.
    assert proxy.used_after_hang == 0
    assert backend.read_range("data", 20, 10, None, terms=back) == DATA[20:30]  # once: kept
    eventually(
        lambda: any(c.generation == 1 and not c.answered for c in connections._idle),
        5,
        "the spare opened again",
    )
    assert all(c.generation == 1 for c in connections._idle)


def test_a_new_connection_waits_for_its_first_answer_only_the_probes_timeout(
    proxy: FaultProxy, stored: tuple[str, str]
) -> None:
    """A connection that never carried an answer (a spare, a new one) gives up on a store that
    does not answer after the probe's answer timeout, not the request timeout; from its first
    answer on, it waits the request timeout."""
    bucket, _ = stored
    backend = _backend(proxy.endpoint_url, bucket, read_timeout=30.0)
    proxy.hang()
    started = time.monotonic()
    try:
        with (
            pytest.raises(S3RequestFailed) as caught,
            backend.engine.get("data", 0, 10, None),
        ):
            pass
    finally:
        proxy.resume()
    took = time.monotonic() - started
    assert caught.value.unanswered is Unanswered.READ_TIMEOUT
    # Not the request's 30 s: a bound at it, ten times the probe's timeout, which no load
    # reaches (not a speed check); the timeouts themselves are read off the sockets below.
    assert took < 30.0, took
    assert backend.read_range("data", 0, 10, None) == DATA[:10]
    connections = backend.engine._target.connections
    answered = [c for c in connections._idle if c.answered]
    assert answered
    assert _receive_timeout(answered[0].sock) == pytest.approx(30.0)
    # The spare opened since has carried no answer yet: the probe's timeout.
    spare = eventually(
        lambda: [c for c in connections._idle if not c.answered], 5, "a spare connection"
    )
    assert _receive_timeout(spare[0].sock) == pytest.approx(PROBE_ANSWER_TIMEOUT)


def _receive_timeout(sock: socket.socket) -> float:
    """A plain socket's SO_RCVTIMEO, in seconds."""
    seconds, micros = struct.unpack(
        "ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
    )
    return float(seconds + micros / 1e6)
