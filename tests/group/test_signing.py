"""Signed peer requests (pffs.group.signing): a good signature passes once; a changed target,
another secret, an old timestamp, a replay, a request for another member, a header not of its
form (non-ASCII included: it once raised out of the server) or a missing one is refused; a full
nonce window refuses, never forgets; a principal's proof matches only its own key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pffs.errors import UsageError
from pffs.group import signing

SECRET = b"a-shared-secret-of-the-group"
TARGET = "/v3/block?s=s3%3A%2F%2Fb&p=f&v=e&i=0&n=10&b=4"
ME = "node1"


def test_a_signed_request_passes_once() -> None:
    verifier = signing.Verifier(SECRET, ME)
    headers = signing.sign(SECRET, "GET", TARGET, ME)
    assert SECRET.decode() not in "".join(headers.values())
    assert isinstance(verifier.check("GET", TARGET, headers), signing.Signed)
    assert verifier.check("GET", TARGET, headers) == "replayed"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h, t: (h, t.replace("i=0", "i=1")), "bad signature"),
        (lambda h, t: (signing.sign(b"another-secret-entirely", "GET", t, ME), t), "bad signature"),
        (lambda h, t: ({**h, signing.TIME: f"{time.time() - 120:.3f}"}, t), "old timestamp"),
        (lambda h, t: ({**h, signing.TIME: "nan"}, t), "bad timestamp"),
        (lambda h, t: ({**h, signing.TIME: "soon"}, t), "bad timestamp"),
        (lambda h, t: ({**h, signing.TIME: "1e3"}, t), "bad timestamp"),
        (lambda h, t: ({k: v for k, v in h.items() if k != signing.NONCE}, t), "unsigned"),
        (lambda h, t: ({k: v for k, v in h.items() if k != signing.TO}, t), "unsigned"),
        (lambda h, t: ({}, t), "unsigned"),
        # a request for another member, replayed here
        (lambda h, t: (signing.sign(SECRET, "GET", t, "node2"), t), "for another member"),
        (lambda h, t: ({**h, signing.TO: "node2"}, t), "for another member"),
        # not of the form: non-ASCII (latin-1 decoded, as the server decodes headers), upper
        # case, short, long
        (lambda h, t: ({**h, signing.SIGNATURE: "\xe9" * 64}, t), "malformed signature"),
        (
            lambda h, t: ({**h, signing.SIGNATURE: h[signing.SIGNATURE].upper()}, t),
            "malformed signature",
        ),
        (
            lambda h, t: ({**h, signing.SIGNATURE: h[signing.SIGNATURE][:-1]}, t),
            "malformed signature",
        ),
        (lambda h, t: ({**h, signing.NONCE: h[signing.NONCE] + "0"}, t), "malformed signature"),
        (lambda h, t: ({**h, signing.NONCE: "\xff" * 32}, t), "malformed signature"),
    ],
)
def test_bad_requests_are_refused(change, reason: str) -> None:
    headers, target = change(signing.sign(SECRET, "GET", TARGET, ME), TARGET)
    assert signing.Verifier(SECRET, ME).check("GET", target, headers) == reason


def test_a_full_nonce_window_refuses_and_forgets_nothing(monkeypatch) -> None:
    """Once MAX_NONCES nonces of the window are held, a new request is refused, and every
    request already seen stays a replay; once they age out, requests pass again."""
    monkeypatch.setattr(signing, "MAX_NONCES", 3)
    verifier = signing.Verifier(SECRET, ME)
    seen = [signing.sign(SECRET, "GET", TARGET, ME) for _ in range(3)]
    for headers in seen:
        assert isinstance(verifier.check("GET", TARGET, headers), signing.Signed)
    assert verifier.check("GET", TARGET, signing.sign(SECRET, "GET", TARGET, ME)) == (signing.BUSY)
    assert [verifier.check("GET", TARGET, h) for h in seen] == ["replayed"] * 3
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + signing.MAX_SKEW + 1)
    assert isinstance(
        verifier.check("GET", TARGET, signing.sign(SECRET, "GET", TARGET, ME)), signing.Signed
    )


def test_a_principal_proof_matches_only_its_key() -> None:
    alice, bob = b"alice-principal-key", b"bob-principal-key"
    verifier = signing.Verifier(SECRET, ME)
    proven = verifier.check("GET", TARGET, signing.sign(SECRET, "GET", TARGET, ME, alice))
    assert isinstance(proven, signing.Signed)
    assert proven.proves(alice) and not proven.proves(bob)
    bare = verifier.check("GET", TARGET, signing.sign(SECRET, "GET", TARGET, ME))
    assert isinstance(bare, signing.Signed) and not bare.proves(alice)
    # a proof lifted from another request proves nothing for this one
    other = signing.sign(SECRET, "GET", TARGET, ME, alice)
    headers = {**signing.sign(SECRET, "GET", TARGET, ME), signing.PROOF: other[signing.PROOF]}
    lifted = verifier.check("GET", TARGET, headers)
    assert isinstance(lifted, signing.Signed) and not lifted.proves(alice)


def test_a_reply_tag_covers_each_field() -> None:
    tag = signing.reply_tag(SECRET, "ab" * 16, ME, '"v1"', 4096, 7)
    assert len(tag) == signing.TAG_SIZE
    for changed in (
        signing.reply_tag(b"another-secret-entirely", "ab" * 16, ME, '"v1"', 4096, 7),
        signing.reply_tag(SECRET, "cd" * 16, ME, '"v1"', 4096, 7),
        signing.reply_tag(SECRET, "ab" * 16, "node2", '"v1"', 4096, 7),
        signing.reply_tag(SECRET, "ab" * 16, ME, '"v2"', 4096, 7),
        signing.reply_tag(SECRET, "ab" * 16, ME, '"v1"', 4095, 7),
        signing.reply_tag(SECRET, "ab" * 16, ME, '"v1"', 4096, 8),
    ):
        assert not signing.tags_match(tag, changed)
    assert signing.tags_match(tag, signing.reply_tag(SECRET, "ab" * 16, ME, '"v1"', 4096, 7))


def test_the_secret_file_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("short\n")
    with pytest.raises(UsageError, match="16 bytes or more"):
        signing.read_secret(str(path))
    path.write_text(SECRET.decode() + "\n")
    assert signing.read_secret(str(path)) == SECRET
    with pytest.raises(UsageError, match="No such file"):
        signing.read_secret(str(tmp_path / "absent"))


def test_a_member_named_by_its_address_takes_requests_for_that_address() -> None:
    """A `dns://` list names members by address: a request for the address the member was
    reached at passes (IPv6 as the list spells it), one for another address does not."""
    verifier = signing.Verifier(SECRET, "host-name")
    for address, name in (("10.0.0.5", "10.0.0.5"), ("fd00::5", "fd00--5")):
        signed = verifier.check("GET", TARGET, signing.sign(SECRET, "GET", TARGET, name), address)
        assert isinstance(signed, signing.Signed) and signed.to == name
    other = signing.sign(SECRET, "GET", TARGET, "10.0.0.6")
    assert verifier.check("GET", TARGET, other, "10.0.0.5") == "for another member"
