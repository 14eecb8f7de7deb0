"""Signed peer requests (pffs.group.signing): a good signature passes once; a changed target,
another secret, an old timestamp, a replay or a missing header is refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pffs.errors import UsageError
from pffs.group import signing

SECRET = b"a-shared-secret-of-the-group"
TARGET = "/v1/block?s=s3%3A%2F%2Fb&p=f&v=e&i=0&n=10&b=4"


def test_a_signed_request_passes_once() -> None:
    verifier = signing.Verifier(SECRET)
    headers = signing.sign(SECRET, "GET", TARGET)
    assert SECRET.decode() not in "".join(headers.values())
    assert verifier.refusal("GET", TARGET, headers) is None
    assert verifier.refusal("GET", TARGET, headers) == "replayed"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h, t: (h, t.replace("i=0", "i=1")), "bad signature"),
        (lambda h, t: (signing.sign(b"another-secret-entirely", "GET", t), t), "bad signature"),
        (lambda h, t: ({**h, signing.TIME: f"{time.time() - 120:.3f}"}, t), "old timestamp"),
        (lambda h, t: ({**h, signing.TIME: "nan"}, t), "old timestamp"),
        (lambda h, t: ({**h, signing.TIME: "soon"}, t), "bad timestamp"),
        (lambda h, t: ({k: v for k, v in h.items() if k != signing.NONCE}, t), "unsigned"),
        (lambda h, t: ({}, t), "unsigned"),
    ],
)
def test_bad_requests_are_refused(change, reason: str) -> None:
    headers, target = change(signing.sign(SECRET, "GET", TARGET), TARGET)
    assert signing.Verifier(SECRET).refusal("GET", target, headers) == reason


def test_the_secret_file_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("short\n")
    with pytest.raises(UsageError, match="16 bytes or more"):
        signing.read_secret(str(path))
    path.write_text(SECRET.decode() + "\n")
    assert signing.read_secret(str(path)) == SECRET
    with pytest.raises(UsageError, match="No such file"):
        signing.read_secret(str(tmp_path / "absent"))
