"""The peer keyring: a rotation of the key peer calls are signed with, without downtime."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from cellactors.errors import ConfigError, Unauthorized
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import signing
from cellactors.server.peer_keys import PeerKeys, keyring_file, parse_keyring
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually
from tests.helpers.served import served_node

OLD, NEW = secrets.token_bytes(32), secrets.token_bytes(32)


def signed(key: bytes) -> dict[str, str]:
    return signing.sign_request(
        key, "POST", "/p", b"{}", source="a", target="b", target_generation="g", now=1000.0
    )


def verify(keys: PeerKeys, headers: dict[str, str]) -> str:
    return signing.verify_request(
        keys.accepted,
        "POST",
        "/p",
        b"{}",
        headers,
        expected_target="b",
        expected_generation="g",
        nonces=signing.NonceCache(),
        now=1000.0,
    )


def test_the_first_key_signs_and_every_key_is_accepted() -> None:
    keys = parse_keyring(f"# rotating\n{OLD.hex()}\n\n{NEW.hex()}  # next\n", "ring")
    assert keys.signing == OLD and keys.accepted == (OLD, NEW)
    assert verify(keys, signed(OLD)) == verify(keys, signed(NEW)) == "a"
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(PeerKeys.single(NEW), signed(OLD))
    for bad in ("", "# only a comment\n", "abc\n", OLD.hex() + "00\n"):
        with pytest.raises(ConfigError):
            parse_keyring(bad, "ring")


def test_a_rotation_keeps_every_pair_of_nodes_talking(sw_bucket: S3Bucket, tmp_path: Path) -> None:
    """Step 2 of a rotation: node a still signs with the old key, node b with the new one;
    both accept both. Then b alone moves to the new key only: a's old signature is
    refused, and a call forwarded by a fails ``not_run``."""
    ring_a, ring_b = tmp_path / "a.keys", tmp_path / "b.keys"
    ring_a.write_text(f"{OLD.hex()}\n{NEW.hex()}\n")
    ring_b.write_text(f"{NEW.hex()}\n{OLD.hex()}\n")
    from cellactors.server.app import ServerSettings

    with (
        served_node(sw_bucket, "a", ServerSettings(), (Counter,), keys=keyring_file(ring_a)) as a,
        served_node(sw_bucket, "b", ServerSettings(), (Counter,), keys=keyring_file(ring_b)) as b,
        httpx.Client(timeout=30) as http,
    ):

        def increment(via: str, cell: str) -> httpx.Response:
            return http.post(
                f"{via}/cells/Counter/{cell}/increment",
                json={"name": "n"},
                headers={"content-type": "application/json"},
            )

        assert increment(a.public, "on-a").headers["x-cellactors-node"] == "a"
        assert increment(b.public, "on-b").headers["x-cellactors-node"] == "b"
        forwarded = (increment(b.public, "on-a"), increment(a.public, "on-b"))
        assert [r.json() for r in forwarded] == [{"result": 2}, {"result": 2}]
        assert [r.headers["x-cellactors-node"] for r in forwarded] == ["a", "b"]
        # b drops the old key (read again within a second): a's signatures are refused.
        ring_b.write_text(f"{NEW.hex()}\n")
        assert eventually(lambda: increment(a.public, "on-b").status_code == 502)
        answer = increment(a.public, "on-b")
        assert (answer.json()["error"], answer.json()["outcome"]) == ("peer_refused", "not_run")
