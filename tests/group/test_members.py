"""Member lists (pffs.group.members, kubemembers): the file form's checks, and the
EndpointSlices of a headless Service, read from tests/csi's stand-in for the Kubernetes API
server (a stand-in: no API server runs on this machine)."""

from __future__ import annotations

import pytest
import trio

from pffs.config import MembersDns, MembersKube
from pffs.group.kubemembers import KubeMembers, members_of
from pffs.group.members import Member, MembershipError, parse_member_list
from pffs.kube import KubeClient
from pffs.optionvalues import BadValue, member_source
from tests.csi.kube_apiserver import FakeApiServer


def test_a_member_file_is_parsed() -> None:
    text = "# the group\nnode-a http://10.0.0.1:7070\n\n  node-b   http://[fd00::2]:7070/  # b\n"
    assert parse_member_list(text) == (
        Member("node-a", "http://10.0.0.1:7070"),
        Member("node-b", "http://[fd00::2]:7070"),
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a http://h:1\na http://h:2\n", "named twice"),
        ("a http://h:1 extra\n", "expected NAME"),
        ("a https://h:1\n", "expected http://HOST:PORT"),
        ("a http://h\n", "expected http://HOST:PORT"),
        ("a http://h:1/path\n", "expected http://HOST:PORT"),
        ("a http://u:p@h:1\n", "expected http://HOST:PORT"),
        ("a/b http://h:1\n", "letters, digits"),
    ],
)
def test_a_malformed_member_file_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(MembershipError, match=fragment):
        parse_member_list(text)


def test_k8s_sources_are_checked() -> None:
    assert member_source("k8s://pffs-system/pffs-group") == MembersKube("pffs-system", "pffs-group")
    for bad in ("k8s://ns", "k8s://NS/svc", "k8s://ns/svc/x", "k8s:///svc"):
        with pytest.raises(BadValue):
            member_source(bad)


def endpoint(node: str, ip: str, **conditions: bool) -> dict[str, object]:
    return {"addresses": [ip], "nodeName": node, "conditions": conditions}


def test_ready_endpoints_own_terminating_ones_still_serve() -> None:
    slices = [
        {
            "ports": [{"name": "metrics", "port": 9567}, {"name": "peer", "port": 7070}],
            "endpoints": [
                endpoint("node-a", "10.0.0.1", ready=True, serving=True, terminating=False),
                endpoint("node-b", "10.0.0.2", ready=False, serving=True, terminating=True),
                endpoint("node-c", "10.0.0.3", ready=False, serving=False, terminating=True),
                {"addresses": ["10.0.0.4"]},  # no node name: not a member
            ],
        }
    ]
    assert members_of(slices) == (
        Member("node-a", "http://10.0.0.1:7070"),
        Member("node-b", "http://10.0.0.2:7070", owns=False),
    )


def test_members_from_the_endpoint_slices_of_a_service() -> None:
    with FakeApiServer() as api:
        ready = [
            endpoint("node-a", "10.0.0.1", ready=True),
            endpoint("node-b", "10.0.0.2", ready=True),
        ]
        api.set_endpoint_slice("pffs", "group-abc", "pffs-group", 7070, ready)
        api.set_endpoint_slice(
            "pffs", "other-xyz", "another-service", 80, [endpoint("x", "10.9.9.9", ready=True)]
        )
        source = KubeMembers("pffs", "pffs-group", KubeClient(api.url))
        found = trio.run(source.load)
    assert [m.name for m in found] == ["node-a", "node-b"]
    assert found[0].url == "http://10.0.0.1:7070" and found[0].owns


def test_members_from_dns() -> None:
    from pffs.group.dnsmembers import DnsMembers, members_of

    assert member_source("dns://pffs-group.pffs.svc.cluster.local:7070") == MembersDns(
        "pffs-group.pffs.svc.cluster.local", 7070
    )
    for bad in ("dns://name", "dns://:7070", "dns://name:port", "dns://name:70/path"):
        with pytest.raises(BadValue):
            member_source(bad)
    assert members_of(["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::1"], 7070) == (
        Member("10.0.0.1", "http://10.0.0.1:7070"),
        Member("10.0.0.2", "http://10.0.0.2:7070"),
        Member("fd00--1", "http://[fd00::1]:7070"),
    )
    found = trio.run(DnsMembers("localhost", 7070).load)  # the resolver of this machine
    assert Member("127.0.0.1", "http://127.0.0.1:7070") in found
    with pytest.raises(MembershipError):
        trio.run(DnsMembers("no-such-name.invalid", 7070).load)
