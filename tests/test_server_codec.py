"""The HTTP codec: encodings, keyword-argument bodies, and the streamed size limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellactors import errors
from cellactors.errors import BadRequest, CallError, MethodFailed
from cellactors.wire import codec


class Feed:
    """An async chunk source that counts how many bytes were pulled from it."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self.pulled = 0

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None
        self.pulled += len(chunk)
        return chunk


def endless(chunk: bytes) -> Iterable[bytes]:
    while True:
        yield chunk


def read(feed: Feed, content_length: str | None, limit: int, drain: int | None = None) -> bytes:
    return asyncio.run(codec.read_body(feed, content_length, limit, drain_limit=drain))


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        (None, "json"),
        ("", "json"),
        ("application/json", "json"),
        ("text/plain", "json"),
        ("application/msgpack", "msgpack"),
        ("Application/MsgPack; charset=binary", "msgpack"),
        ("application/x-msgpack", "msgpack"),
    ],
)
def test_encoding_for(content_type: str | None, expected: str) -> None:
    assert codec.encoding_for(content_type) == expected


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_kwargs_round_trip_including_bytes(encoding: codec.Encoding) -> None:
    kwargs = {"name": "x", "n": 3, "blob": b"\x00\xffraw", "nested": {"a": [1, 2.5, None]}}
    assert codec.decode_kwargs(codec.encode(kwargs, encoding), encoding) == kwargs


def test_json_carries_bytes_as_tagged_base64() -> None:
    body = codec.encode({"b": b"hi"}, "json")
    assert body == b'{"b":{"$bytes":"aGk="}}'
    # A tag with invalid base64 is left as the object it is.
    assert codec.decode(b'{"$bytes": "!!"}', "json") == {"$bytes": "!!"}


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_empty_body_means_no_arguments(encoding: codec.Encoding) -> None:
    assert codec.decode_kwargs(b"", encoding) == {}
    assert codec.decode_kwargs(b"  \n", "json") == {}


@pytest.mark.parametrize(
    ("body", "encoding", "fragment"),
    [
        (b'{"a": ', "json", "malformed json"),
        (b"\xff\xfe", "json", "malformed json"),
        (b"\xc1", "msgpack", "malformed msgpack"),
        (msgpack.packb({"a": 1}) + b"\x01", "msgpack", "malformed msgpack"),
        (b"[1, 2]", "json", "object of keyword arguments"),
        (b'"text"', "json", "object of keyword arguments"),
        (b"42", "json", "object of keyword arguments"),
        (msgpack.packb([1, 2]), "msgpack", "object of keyword arguments"),
        (b'{"1x": 1}', "json", "not a valid identifier"),
        (msgpack.packb({1: 2}), "msgpack", "not a valid identifier"),
    ],
)
def test_bad_bodies_are_bad_requests(body: bytes, encoding: codec.Encoding, fragment: str) -> None:
    with pytest.raises(BadRequest) as info:
        codec.decode_kwargs(body, encoding)
    assert fragment in str(info.value)
    assert info.value.status == 400
    assert info.value.to_dict()["error"] == "bad_request"


def test_result_and_error_bodies() -> None:
    assert codec.decode(codec.encode_result([1, "a"], "json"), "json") == {"result": [1, "a"]}
    assert codec.decode(codec.encode_result(None, "msgpack"), "msgpack") == {"result": None}
    err = codec.decode(codec.encode_error(MethodFailed("KeyError", "'k'"), "json"), "json")
    assert err == {
        "error": "method_failed",
        "message": "KeyError: 'k'",
        "outcome": "failed",
        "retryable": False,
        "type": "KeyError",
        "detail": "'k'",
    }


def test_unencodable_result_raises_type_error() -> None:
    with pytest.raises(TypeError):
        codec.encode_result(object(), "json")


def test_read_body_within_limit_joins_chunks() -> None:
    feed = Feed([b"ab", b"", b"cd"])
    assert read(feed, "4", limit=4) == b"abcd"
    assert read(Feed([]), None, limit=4) == b""


def test_declared_length_far_over_limit_is_refused_before_reading() -> None:
    feed = Feed(endless(b"x" * 1024))
    with pytest.raises(errors.PayloadTooLarge) as info:
        read(feed, str(10 << 20), limit=1024, drain=4096)
    assert feed.pulled == 0
    assert info.value.status == 413
    assert info.value.drained is False
    assert isinstance(info.value, BadRequest)


def test_streamed_body_stops_at_the_drain_limit() -> None:
    """No Content-Length (chunked upload): the limit is checked while streaming."""
    feed = Feed(endless(b"x" * 1000))
    with pytest.raises(errors.PayloadTooLarge) as info:
        read(feed, None, limit=10_000, drain=30_000)
    assert 30_000 < feed.pulled <= 31_000
    assert info.value.drained is False


def test_oversized_body_that_ends_within_drain_is_drained() -> None:
    feed = Feed([b"x" * 1000] * 20)
    with pytest.raises(errors.PayloadTooLarge) as info:
        read(feed, "20000", limit=10_000)
    assert feed.pulled == 20_000
    assert info.value.drained is True
    assert info.value.to_dict() == {
        "error": "payload_too_large",
        "message": "request body exceeds the limit of 10000 bytes",
        "outcome": "not_run",
        "retryable": False,
    }


def test_lying_content_length_is_still_limited() -> None:
    feed = Feed(endless(b"y" * 100))
    with pytest.raises(errors.PayloadTooLarge):
        read(feed, "10", limit=1000, drain=2000)
    assert feed.pulled <= 2100


@pytest.mark.parametrize("value", ["abc", "-1", "1.5"])
def test_invalid_content_length(value: str) -> None:
    with pytest.raises(BadRequest, match="Content-Length"):
        read(Feed([b"x"]), value, limit=10)


def test_default_limit_is_one_mebibyte() -> None:
    assert codec.DEFAULT_MAX_BODY == 1 << 20
    assert read(Feed([b"z" * (1 << 20)]), None, limit=codec.DEFAULT_MAX_BODY) == b"z" * (1 << 20)
    with pytest.raises(errors.PayloadTooLarge):
        read(Feed([b"z" * ((1 << 20) + 1)]), None, limit=codec.DEFAULT_MAX_BODY)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text().filter(lambda k: k != codec.BYTES_TAG), inner, max_size=4)
    ),
    max_leaves=12,
)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)


@given(st.dictionaries(identifiers, json_values, max_size=5), st.sampled_from(["json", "msgpack"]))
def test_kwargs_round_trip_property(kwargs: dict[str, Any], encoding: codec.Encoding) -> None:
    assert codec.decode_kwargs(codec.encode(kwargs, encoding), encoding) == kwargs


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_crash_the_decoder(body: bytes) -> None:
    encodings: tuple[codec.Encoding, ...] = ("json", "msgpack")
    for encoding in encodings:
        try:
            codec.decode_kwargs(body, encoding)
        except CallError as e:
            assert e.status == 400


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_json_bodies_with_nan_or_infinity_are_bad_requests(constant: bytes) -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        codec.decode_kwargs(b'{"x": ' + constant + b"}", "json")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_json_encoding_is_strict(value: float) -> None:
    with pytest.raises(ValueError):
        codec.encode_result([value], "json")
    assert codec.decode(codec.encode_result(value, "msgpack"), "msgpack")["result"] != 0


@pytest.mark.parametrize(
    ("result", "encoding", "ok"),
    [
        (1.5, "json", True),
        (float("nan"), "json", False),
        (float("nan"), "msgpack", True),
        (2**70, "json", True),
        (2**70, "msgpack", False),
        (object(), "json", False),
        ({"b": b"\x00"}, "json", True),
    ],
)
def test_result_check_refuses_what_the_encoding_cannot_carry(
    result: Any, encoding: codec.Encoding, ok: bool
) -> None:
    check = codec.ResultCheck(encoding)
    if not ok:
        with pytest.raises(ValueError, match=f"cannot be encoded as {encoding}"):
            check(result)
        return
    check(result)
    body = check.body_for(result)
    assert body == codec.encode_result(result, encoding)
    assert check.body_for(result) is body  # encoded once, reused by the answer


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], None),
        (["k1"], "k1"),
        (["A-z_0.9:x"], "A-z_0.9:x"),
        (["k" * 128], "k" * 128),
    ],
)
def test_idempotency_keys(values: list[str], expected: str | None) -> None:
    assert codec.idempotency_key(values) == expected


@pytest.mark.parametrize(
    "values", [[""], ["k" * 129], ["with space"], ["slash/y"], ["ü"], ["a", "b"], ["a", "a"]]
)
def test_malformed_or_repeated_idempotency_keys_are_bad_requests(values: list[str]) -> None:
    with pytest.raises(BadRequest, match="Idempotency-Key"):
        codec.idempotency_key(values)


@pytest.mark.parametrize("number", [b"1e400", b"-1e999", b"123456789e999"])
def test_json_numbers_that_do_not_fit_a_float_are_bad_requests(number: bytes) -> None:
    # json would parse them to infinity: stored, then no JSON answer or feed could carry it.
    with pytest.raises(BadRequest, match="out of range"):
        codec.decode_kwargs(b'{"x": ' + number + b"}", "json")
    assert codec.decode_kwargs(b'{"x": 1.5e300}', "json") == {"x": 1.5e300}


def test_msgpack_infinities_and_nans_are_bad_requests() -> None:
    for value in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(BadRequest, match="JSON cannot carry"):
            codec.decode_kwargs(msgpack.packb({"x": [1, {"y": value}]}), "msgpack")


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_arguments_nest_at_most_max_nesting_levels(encoding: codec.Encoding) -> None:
    def nested(levels: int) -> dict[str, Any]:
        value: Any = 1
        for _ in range(levels - 1):
            value = [value]
        return {"x": value}

    fits = nested(codec.MAX_NESTING)  # the body object is the first level
    assert codec.decode_kwargs(codec.encode(fits, encoding), encoding) == fits
    with pytest.raises(BadRequest, match="nest deeper"):
        codec.decode_kwargs(codec.encode(nested(codec.MAX_NESTING + 1), encoding), encoding)


@given(st.dictionaries(identifiers, json_values, max_size=5))
def test_json_bodies_decode_as_json_loads_reads_bytes(kwargs: dict[str, Any]) -> None:
    """The shared decoder reads bytes as ``json.loads`` does: UTF-8 with or without a BOM,
    UTF-16 and UTF-32 (told apart by the first bytes)."""
    text = codec.encode(kwargs, "json").decode()
    for body in (
        text.encode("utf-8"),
        text.encode("utf-8-sig"),
        text.encode("utf-16"),
        text.encode("utf-16-le"),
        text.encode("utf-32"),
    ):
        assert codec.decode_kwargs(body, "json") == kwargs


def test_concurrent_json_bodies_decode_apart() -> None:
    """One decoder serves every thread: bodies decoded at once in many threads each come back
    as themselves."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = [b'{"k%d": {"nested": [%d, {"x": "%d"}]}}' % (i, i, i) for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda body: codec.decode_kwargs(body, "json"), bodies))
    assert got == [{f"k{i}": {"nested": [i, {"x": str(i)}]}} for i in range(400)]
