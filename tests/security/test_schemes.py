"""The built-in authentication schemes: API keys from a file and JWT bearer tokens."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from cellactors import Principal
from cellactors.errors import ConfigError, Unauthenticated
from cellactors.server.auth import ApiKeys, Authentication, JwtBearer
from cellactors.server.auth.authentication import HookScheme, check_exposure

ALICE_KEY = "ak_alice_0123456789abcdef"
BOB_KEY = "ak_bob_0123456789abcdef01"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def write_keys(path: Path, keys: dict[str, Any]) -> None:
    path.write_text(json.dumps(keys))


def test_api_keys_name_their_principal_and_refuse_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    write_keys(path, {ALICE_KEY: {"principal": "alice", "roles": ["admin"]}})
    auth = Authentication([ApiKeys(path)])
    assert auth.authenticate(bearer(ALICE_KEY)) == Principal("alice", frozenset({"admin"}))
    assert auth.authenticate({}) is None  # anonymous
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer(BOB_KEY))
    with pytest.raises(Unauthenticated):
        auth.authenticate({"authorization": f"Basic {ALICE_KEY}"})


def test_a_changed_keys_file_is_read_again_and_a_broken_one_keeps_the_old_keys(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.json"
    write_keys(path, {ALICE_KEY: {"principal": "alice"}})
    keys = ApiKeys(path)
    write_keys(path, {BOB_KEY: {"principal": "bob"}})  # alice revoked, bob added
    later = time.monotonic() + 5
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert len(keys.file.current(now=later)) == 1  # looked again: bob's file
    assert keys.authenticate(bearer(BOB_KEY)) == Principal("bob")
    assert keys.authenticate(bearer(ALICE_KEY)) is None
    path.write_text("{not json")
    os.utime(path, ns=(time.time_ns() + 3 * 10**9, time.time_ns() + 3 * 10**9))
    assert len(keys.file.current(now=later + 5)) == 1  # unusable: still bob's
    assert keys.authenticate(bearer(BOB_KEY)) == Principal("bob")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[]", "expected an object"),
        ('{"short": {"principal": "a"}}', "shorter than"),
        (json.dumps({ALICE_KEY: {"roles": []}}), "needs a string 'principal'"),
        (json.dumps({ALICE_KEY: {"principal": "a", "roles": "admin"}}), "list of strings"),
    ],
)
def test_a_bad_keys_file_is_refused_naming_what_is_wrong_never_the_key(
    tmp_path: Path, content: str, words: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        ApiKeys(path)
    assert words in str(info.value) and ALICE_KEY not in str(info.value)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem(key: rsa.RSAPrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def token(key: rsa.RSAPrivateKey, kid: str | None = None, **claims: Any) -> str:
    body = {"sub": "alice", "exp": int(time.time()) + 60, "iss": "idp", "aud": "cells", **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": kid} if kid else None)


def test_a_jwt_names_its_subject_and_roles_and_every_bad_one_is_401(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    path = tmp_path / "key.pem"
    path.write_text(pem(rsa_key))
    scheme = JwtBearer(path, issuer="idp", audience="cells")
    assert scheme.authenticate(bearer(token(rsa_key, roles=["feed"]))) == Principal(
        "alice", frozenset({"feed"})
    )
    assert scheme.authenticate(bearer(token(rsa_key, roles="a b"))) == Principal(
        "alice", frozenset({"a", "b"})
    )
    assert scheme.authenticate(bearer(ALICE_KEY)) is None  # not a JWT: another scheme's
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bad = [
        token(other),  # signed by another key
        token(rsa_key, exp=int(time.time()) - 120),  # expired
        token(rsa_key, aud="elsewhere"),
        token(rsa_key, iss="mallory"),
        jwt.encode({"sub": "alice", "aud": "cells", "iss": "idp"}, rsa_key, algorithm="RS256"),
        jwt.encode(
            {"sub": "alice", "exp": int(time.time()) + 60},
            "a-shared-secret-of-thirty-two-bytes!",
            algorithm="HS256",
        ),  # a shared-secret token: never accepted
    ]
    for t in bad:
        with pytest.raises(Unauthenticated):
            scheme.authenticate(bearer(t))


def test_a_jwks_file_holds_old_and_new_keys_during_a_rotation(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    new = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
        value = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        return {**value, "kid": kid, "use": "sig", "alg": "RS256"}

    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk(rsa_key, "old"), jwk(new, "new")]}))
    scheme = JwtBearer(path)
    assert scheme.authenticate(bearer(token(rsa_key, kid="old"))) == Principal("alice")
    assert scheme.authenticate(bearer(token(new, kid="new"))) == Principal("alice")
    with pytest.raises(Unauthenticated):
        scheme.authenticate(bearer(token(new, kid="gone")))


def test_an_apps_own_scheme_is_asked_after_the_built_in_ones(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    write_keys(path, {ALICE_KEY: {"principal": "alice"}})

    def mine(headers: Any) -> Principal | None:
        return Principal("svc") if headers.get("authorization") == "Bearer internal-svc" else None

    auth = Authentication([ApiKeys(path), HookScheme(mine, "app:mine")])
    assert auth.authenticate(bearer("internal-svc")) == Principal("svc")
    assert auth.authenticate(bearer(ALICE_KEY)) == Principal("alice")


def test_an_open_listener_beyond_loopback_is_refused_unless_on_purpose(tmp_path: Path) -> None:
    check_exposure(Authentication(), "127.0.0.1", False)
    check_exposure(Authentication(), "::1", False)
    with pytest.raises(ConfigError, match="--allow-anonymous"):
        check_exposure(Authentication(), "0.0.0.0", False)
    check_exposure(Authentication(), "0.0.0.0", True)
    path = tmp_path / "keys.json"
    write_keys(path, {ALICE_KEY: {"principal": "alice"}})
    check_exposure(Authentication([ApiKeys(path)]), "0.0.0.0", False)


def test_an_apps_own_scheme_may_read_a_header_of_its_own() -> None:
    """A gateway that authenticates and passes the user in its own header: the hook is
    asked even when no Authorization header was sent."""

    def gateway(headers: Any) -> Principal | None:
        user = headers.get("x-user")
        return Principal(user) if user else None

    auth = Authentication([HookScheme(gateway, "app:gateway")])
    assert auth.authenticate({"x-user": "carol"}) == Principal("carol")
    assert auth.authenticate({}) is None
