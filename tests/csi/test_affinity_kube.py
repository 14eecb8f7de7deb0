"""The Kubernetes API client (pffs/kube.py) against a local stand-in for the API server.

No Kubernetes API server can run on this machine, so tests/csi/kube_apiserver.py serves the
endpoints the client uses over real HTTP and HTTPS on 127.0.0.1, in the API's shapes.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pffs.kube import KubeClient, KubeError
from pffs.testing.servers import free_port
from tests.csi.kube_apiserver import FakeApiServer


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def test_gets_and_misses(api: FakeApiServer) -> None:
    api.add_pffs_claim("ml", "imagenet", "pv-1", {"source": "s3://b/imagenet"})
    api.add_node("n1")
    client = KubeClient(api.url)
    assert client.get_pvc("ml", "imagenet")["spec"]["volumeName"] == "pv-1"  # type: ignore[index]
    pv = client.get_pv("pv-1")
    assert pv is not None and pv["spec"]["csi"]["volumeAttributes"]["source"] == "s3://b/imagenet"
    assert client.get_node("n1")["metadata"]["name"] == "n1"  # type: ignore[index]
    assert client.get_pvc("ml", "nope") is None
    assert client.get_pv("nope") is None
    assert client.get_node("nope") is None


def test_list_nodes_by_label_selector(api: FakeApiServer) -> None:
    api.add_node("n1", {"data.pffs.io/a-1": "true"})
    api.add_node("n2", {"data.pffs.io/a-1": "true", "data.pffs.io/b-2": "true"})
    api.add_node("n3")
    client = KubeClient(api.url)
    names = lambda sel: sorted(n["metadata"]["name"] for n in client.list_nodes(sel))  # noqa: E731
    assert names(None) == ["n1", "n2", "n3"]
    assert names("data.pffs.io/a-1") == ["n1", "n2"]
    assert names("data.pffs.io/a-1,data.pffs.io/b-2") == ["n2"]
    assert api.requests[-1][1] == "/api/v1/nodes"


def test_merge_patch_of_a_node(api: FakeApiServer) -> None:
    api.add_node("n1", {"data.pffs.io/old-1": "true", "zone": "a"}, {"keep": "me"})
    client = KubeClient(api.url)
    patch = {
        "metadata": {
            "labels": {"data.pffs.io/old-1": None, "data.pffs.io/new-2": "true"},
            "annotations": {"pffs.io/cache": "{}"},
        }
    }
    answer = client.patch_node("n1", patch)
    assert answer["metadata"]["labels"] == {
        "kubernetes.io/hostname": "n1",
        "zone": "a",
        "data.pffs.io/new-2": "true",
    }
    assert answer["metadata"]["annotations"] == {"keep": "me", "pffs.io/cache": "{}"}
    method, path, content_type, body = api.requests[-1]
    assert (method, path, content_type, body) == (
        "PATCH",
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        patch,
    )


def test_errors_carry_status_and_message(api: FakeApiServer) -> None:
    client = KubeClient(api.url)
    api.fail_with = 403
    with pytest.raises(KubeError, match="HTTP 403 injected failure") as info:
        client.get_node("n1")
    assert info.value.status == 403
    api.fail_with = 500
    with pytest.raises(KubeError) as info:
        client.list_nodes()
    assert info.value.status == 500


def test_unreachable_server_is_a_kube_error() -> None:
    client = KubeClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(KubeError, match="unreachable") as info:
        client.get_node("n1")
    assert info.value.status is None


def test_outside_a_pod_in_cluster_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(KubeError, match="--api URL"):
        KubeClient.in_cluster(str(tmp_path), environ={})


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_in_cluster_uses_the_service_account_over_https(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(cert.read_bytes())
    (account / "token").write_text("first-token\n")
    with FakeApiServer(token="first-token", tls=context) as api:
        api.add_node("n1")
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
        client = KubeClient.in_cluster(str(account), environ=env)
        assert client.base_url == f"https://127.0.0.1:{api.port}"
        assert client.get_node("n1") is not None
        # The kubelet rotates projected tokens: the next request reads the new one.
        (account / "token").write_text("second-token")
        with pytest.raises(KubeError, match="401"):
            client.get_node("n1")
        api.token = "second-token"
        assert client.get_node("n1") is not None
        # A server whose certificate the CA did not sign is refused.
        (tmp_path / "other").mkdir()
        (account / "ca.crt").write_bytes(_self_signed(tmp_path / "other")[0].read_bytes())
        other = KubeClient.in_cluster(str(account), environ=env)
        with pytest.raises(KubeError, match="unreachable"):
            other.get_node("n1")
