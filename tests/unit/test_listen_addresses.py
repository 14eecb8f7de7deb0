"""Every listener taking HOST:PORT binds 127.0.0.1 when no host is given (`--metrics :PORT`,
`pffs scheduler-extender --listen :PORT`, `--group-listen :PORT`): every interface is asked for
by name, 0.0.0.0.
And a mount's metrics endpoint, started with `:PORT`, really answers on 127.0.0.1 only."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from pffs.csi.affinity.extender import parse_listen
from pffs.metrics import serve_http
from pffs.optionvalues import host_port
from pffs.testing.servers import free_port


@pytest.mark.parametrize(
    "parse",
    [host_port, parse_listen],
    ids=["metrics and group", "extender"],
)
def test_no_host_is_localhost(parse: Callable[[str], tuple[str, int]]) -> None:
    assert parse(":9567") == ("127.0.0.1", 9567)
    assert parse("0.0.0.0:9567") == ("0.0.0.0", 9567)
    assert parse("[::]:9567") == ("::", 9567)
    assert parse("10.1.2.3:9567") == ("10.1.2.3", 9567)


def _outward_address() -> str | None:
    """An address of this host other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it picks a source address
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_the_metrics_endpoint_of_port_alone_is_not_reachable_from_outside() -> None:
    port = free_port()
    server, _thread = serve_http(f":{port}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        outward = _outward_address()
        if outward is None:
            pytest.skip("this host has no address but loopback")
        with pytest.raises(OSError):
            socket.create_connection((outward, port), timeout=5).close()
    finally:
        server.shutdown()
        server.server_close()
