"""Peer request signing: pure sign/verify and the replay cache, no server involved."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellactors.errors import StaleTarget, Unauthorized
from cellactors.server import signing
from cellactors.server.signing import NonceCache, sign_request, verify_request

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NOW = 1_700_000_000.0
PATH = "/internal/cells/Counter/a/increment"
BODY = b'{"by":2}'
GEN = "0123456789abcdef"


def signed(**overrides: object) -> dict[str, str]:
    args: dict[str, object] = {
        "source": "node-a",
        "target": "node-b",
        "target_generation": GEN,
        "now": NOW,
    }
    args.update(overrides)
    return sign_request(KEY, "POST", PATH, BODY, **args)  # type: ignore[arg-type]


def verify(
    headers: dict[str, str],
    *,
    key: bytes = KEY,
    method: str = "POST",
    path: str = PATH,
    body: bytes = BODY,
    target: str = "node-b",
    generation: str = GEN,
    now: float = NOW,
    cache: NonceCache | None = None,
) -> str:
    return verify_request(
        key,
        method,
        path,
        body,
        headers,
        expected_target=target,
        expected_generation=generation,
        nonces=cache if cache is not None else NonceCache(),
        now=now,
    )


def test_round_trip_returns_the_source() -> None:
    headers = signed()
    assert set(headers) == set(signing.SIGNED_HEADERS)  # no key: no Idempotency-Key header
    assert headers[signing.GENERATION_HEADER] == GEN
    assert headers[signing.TIMESTAMP_HEADER] == str(int(NOW * 1000))
    assert len(headers[signing.NONCE_HEADER]) == 32
    assert verify(headers) == "node-a"


def test_headers_are_matched_case_insensitively_from_a_plain_dict() -> None:
    headers = {k.lower(): v for k, v in signed().items()}
    assert verify(headers) == "node-a"


def test_signature_covers_every_field() -> None:
    message = signing.string_to_sign("post", "/p", b"body", "a", "b", "g7", "123", "n", "k1")
    assert message.split(b"\n") == [
        b"cellactors-hmac-v2",
        b"POST",
        b"/p",
        hashlib.sha256(b"body").hexdigest().encode(),
        b"a",
        b"b",
        b"g7",
        b"123",
        b"n",
        b"k1",
    ]
    # No key is the empty last line (a real key is never empty).
    assert signing.string_to_sign("post", "/p", b"", "a", "b", "g", "1", "n").endswith(b"\nn\n")


def test_idempotency_key_is_sent_and_signed() -> None:
    headers = signed(idempotency_key="order-17")
    assert headers["Idempotency-Key"] == "order-17"
    assert verify(headers) == "node-a"
    for tampered in ("order-18", ""):
        with pytest.raises(Unauthorized, match="bad signature"):
            verify({**headers, "Idempotency-Key": tampered})
    # Removing the key, or adding one to a request signed without, breaks it too.
    without = {k: v for k, v in headers.items() if k != "Idempotency-Key"}
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(without)
    with pytest.raises(Unauthorized, match="bad signature"):
        verify({**signed(), "Idempotency-Key": "order-17"})


def test_a_trace_context_is_sent_and_signed_apart_from_the_caller() -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    headers = signed(trace=trace)
    assert headers[signing.TRACE_HEADER] == trace
    assert verify(headers) == "node-a"
    other = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-01"
    with pytest.raises(Unauthorized, match="bad signature"):
        verify({**headers, signing.TRACE_HEADER: other})
    with pytest.raises(Unauthorized, match="bad signature"):  # removed
        verify({k: v for k, v in headers.items() if k != signing.TRACE_HEADER})
    with pytest.raises(Unauthorized, match="bad signature"):  # added on the way
        verify({**signed(), signing.TRACE_HEADER: trace})
    # A trace line never passes for a caller's: moving the value between headers breaks it.
    as_caller = signed(caller='{"name":"x"}')
    moved = {k: v for k, v in as_caller.items() if k != signing.CALLER_HEADER}
    with pytest.raises(Unauthorized, match="bad signature"):
        verify({**moved, signing.TRACE_HEADER: '{"name":"x"}'})
    # Signed with both, both count.
    both = signed(caller='{"name":"x"}', trace=trace)
    assert verify(both) == "node-a"
    with pytest.raises(Unauthorized, match="bad signature"):
        verify({k: v for k, v in both.items() if k != signing.CALLER_HEADER})
    # Without a trace the signed message is what a node that does not trace computes.
    plain = signing.string_to_sign("post", "/p", b"", "a", "b", "g", "1", "n", "k", "c")
    assert signing.string_to_sign("post", "/p", b"", "a", "b", "g", "1", "n", "k", "c", "") == plain


def test_a_request_for_another_process_generation_is_refused() -> None:
    """A restarted receiver (new generation, empty nonce cache) refuses a replay."""
    headers = signed()
    assert verify(headers, cache=NonceCache()) == "node-a"
    with pytest.raises(StaleTarget, match="process") as info:
        verify(headers, cache=NonceCache(), generation="fedcba9876543210")
    assert info.value.status == 401
    assert info.value.to_dict()["error"] == "stale_target"
    assert info.value.to_dict()["outcome"] == "not_run"
    # The generation header cannot be rewritten to match: it is signed.
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(
            {**headers, signing.GENERATION_HEADER: "fedcba9876543210"},
            generation="fedcba9876543210",
        )


@pytest.mark.parametrize("missing", signing.SIGNED_HEADERS)
def test_unsigned_requests_are_refused(missing: str) -> None:
    headers = signed()
    del headers[missing]
    with pytest.raises(Unauthorized, match="unsigned"):
        verify(headers)


def test_no_headers_at_all() -> None:
    with pytest.raises(Unauthorized) as info:
        verify({})
    assert info.value.status == 401
    assert info.value.to_dict() == {
        "error": "unauthorized",
        "message": info.value.args[0],
        "outcome": "not_run",
        "retryable": False,
    }


@pytest.mark.parametrize(
    "tamper",
    [
        {"method": "PUT"},
        {"path": "/internal/cells/Counter/b/increment"},
        {"body": b'{"by":3}'},
        {"key": OTHER_KEY},
    ],
)
def test_tampered_requests_fail_the_signature(tamper: dict[str, object]) -> None:
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(signed(), **tamper)  # type: ignore[arg-type]


def test_forged_source_fails_the_signature() -> None:
    headers = signed()
    headers[signing.SOURCE_HEADER] = "node-evil"
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(headers)


def test_garbage_signature() -> None:
    headers = signed()
    headers[signing.SIGNATURE_HEADER] = "zz\u00e9"
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(headers)


def test_wrong_target_is_refused_even_when_correctly_signed() -> None:
    with pytest.raises(Unauthorized, match="for node 'node-b'"):
        verify(signed(), target="node-c")


@pytest.mark.parametrize("skew", [-30.0, -0.5, 0.0, 12.0, 30.0])
def test_timestamps_within_the_window_pass(skew: float) -> None:
    assert verify(signed(now=NOW + skew)) == "node-a"


@pytest.mark.parametrize("skew", [-31.0, -3600.0, 30.5, 86400.0])
def test_stale_or_future_timestamps_are_refused(skew: float) -> None:
    with pytest.raises(Unauthorized, match="stale"):
        verify(signed(now=NOW + skew))


@pytest.mark.parametrize(
    ("header", "value", "match"),
    [
        (signing.TIMESTAMP_HEADER, "12a", "timestamp"),
        (signing.TIMESTAMP_HEADER, "-5", "timestamp"),
        (signing.NONCE_HEADER, "short", "nonce"),
        (signing.SOURCE_HEADER, "a/b", "node id"),
        (signing.GENERATION_HEADER, "g g", "generation"),
        (signing.GENERATION_HEADER, "g" * 129, "generation"),
    ],
)
def test_malformed_fields(header: str, value: str, match: str) -> None:
    headers = signed()
    headers[header] = value
    with pytest.raises(Unauthorized, match=match):
        verify(headers)


def test_replayed_nonce_is_refused() -> None:
    cache = NonceCache()
    headers = signed()
    assert verify(headers, cache=cache) == "node-a"
    with pytest.raises(Unauthorized, match="replayed"):
        verify(headers, cache=cache, now=NOW + 1)
    # A fresh nonce from the same source is fine.
    assert verify(signed(), cache=cache, now=NOW + 1) == "node-a"


def test_refused_requests_do_not_consume_their_nonce() -> None:
    cache = NonceCache()
    headers = signed()
    with pytest.raises(Unauthorized):
        verify(headers, cache=cache, target="node-c")
    assert len(cache) == 0
    assert verify(headers, cache=cache) == "node-a"


def test_cache_forgets_nonces_once_they_leave_the_window() -> None:
    cache = NonceCache(window=30.0)
    headers = signed()
    assert verify(headers, cache=cache) == "node-a"
    assert len(cache) == 1
    # Later, an unrelated request prunes the old nonce...
    assert verify(signed(now=NOW + 31), cache=cache, now=NOW + 31) == "node-a"
    assert len(cache) == 1
    # ...and the old request is still refused, as stale.
    with pytest.raises(Unauthorized, match="stale"):
        verify(headers, cache=cache, now=NOW + 31)


def test_cache_keeps_a_nonce_through_the_whole_window() -> None:
    cache = NonceCache(window=30.0)
    assert cache.add("n1", NOW, NOW)
    assert not cache.add("n1", NOW, NOW + 30.0)
    assert cache.add("n1", NOW, NOW + 30.001)  # forgotten only after the window


def test_cache_is_bounded_and_never_lets_an_evicted_nonce_replay() -> None:
    cache = NonceCache(window=30.0, max_entries=3)
    for i in range(3):
        assert cache.add(f"n{i}", NOW + i, NOW)
    assert cache.add("n3", NOW + 3, NOW)  # evicts n0 (expires soonest)
    assert len(cache) == 3
    assert not cache.add("n0", NOW + 0, NOW)  # evicted, but refused by the floor
    assert not cache.add("fresh-but-old", NOW - 1, NOW)  # at or below the floor
    assert cache.add("fresh", NOW + 5, NOW)
    assert len(cache) == 3


def test_key_must_be_32_bytes() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        sign_request(b"short", "POST", PATH, BODY, source="a", target="b", target_generation="g")
    with pytest.raises(ValueError):
        NonceCache(max_entries=0)


@given(
    field=st.sampled_from(
        [
            "method",
            "path",
            "body",
            "source",
            "target",
            "target_generation",
            "timestamp",
            "nonce",
            "idempotency_key",
        ]
    ),
    junk=st.text(alphabet="0123456789abcdef", min_size=1, max_size=4),
)
def test_changing_any_signed_field_breaks_the_signature(field: str, junk: str) -> None:
    fields = {
        "method": "POST",
        "path": PATH,
        "body": BODY,
        "source": "node-a",
        "target": "node-b",
        "target_generation": GEN,
        "timestamp": "1700000000000",
        "nonce": "0" * 32,
        "idempotency_key": "k",
    }
    original = signing.compute_signature(KEY, signing.string_to_sign(**fields))  # type: ignore[arg-type]
    value = fields[field]
    fields[field] = value + (junk.encode() if isinstance(value, bytes) else junk)  # type: ignore[operator]
    changed = signing.compute_signature(KEY, signing.string_to_sign(**fields))  # type: ignore[arg-type]
    assert changed != original
