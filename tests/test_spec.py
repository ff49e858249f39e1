"""Bucket specs, dialect option checks and cell id validation (tables of accepted and
rejected inputs)."""

from __future__ import annotations

from typing import Any

import pytest

from cellactors.core import keys
from cellactors.errors import ConfigError, InvalidCellId
from cellactors.persistence.store.factory import StoreOptions, check_options, open_bucket
from cellactors.persistence.store.gcs import GcsBucket
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.persistence.store.spec import BucketSpec, normalise_prefix, parse_bucket_spec

FORMS = ("s3://BUCKET[/PREFIX]", "gs://BUCKET[/PREFIX]")


def _names_forms(message: str) -> bool:
    return all(form in message for form in FORMS)


# --- bucket specs ---------------------------------------------------------------------

ACCEPTED = [
    ("s3://bucket", ("s3", "bucket", "")),
    ("gs://bucket", ("gs", "bucket", "")),
    ("s3://bucket/", ("s3", "bucket", "")),
    ("gs://bucket///", ("gs", "bucket", "")),
    ("s3://bucket/fleet", ("s3", "bucket", "fleet")),
    ("s3://bucket/fleet/", ("s3", "bucket", "fleet")),
    ("s3://bucket//fleet", ("s3", "bucket", "fleet")),
    ("gs://bucket//team//fleet///", ("gs", "bucket", "team/fleet")),
    ("s3://my.bucket-1/a-b_c.d/E9", ("s3", "my.bucket-1", "a-b_c.d/E9")),
    ("gs://my_bucket/prod", ("gs", "my_bucket", "prod")),
    ("gs://abc", ("gs", "abc", "")),
    ("s3://" + "b" * 63, ("s3", "b" * 63, "")),
    ("gs://" + "b" * 63, ("gs", "b" * 63, "")),
    ("gs://" + ".".join(["a" * 63] * 3), ("gs", ".".join(["a" * 63] * 3), "")),
    ("  s3://bucket/p  ", ("s3", "bucket", "p")),
    ("s3://bucket/v1.2/x...y", ("s3", "bucket", "v1.2/x...y")),
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_accepted_specs(text: str, expected: tuple[str, str, str]) -> None:
    spec = parse_bucket_spec(text)
    assert (spec.scheme, spec.bucket, spec.prefix) == expected
    assert spec.is_gcs == (expected[0] == "gs")
    # The canonical form parses back to itself: one place, one spelling.
    assert parse_bucket_spec(str(spec)) == spec
    assert str(spec) == f"{expected[0]}://{expected[1]}" + (
        f"/{expected[2]}" if expected[2] else ""
    )


def test_spellings_of_one_prefix_are_equal() -> None:
    spellings = ["s3://bkt/a/b", "s3://bkt/a/b/", "s3://bkt//a//b", "s3://bkt/a///b//"]
    assert {parse_bucket_spec(s) for s in spellings} == {BucketSpec("s3", "bkt", "a/b")}


REJECTED = [
    # not one of the two forms
    ("", "empty"),
    ("   ", "empty"),
    ("bucket", "no scheme"),
    ("bucket/prefix", "no scheme"),
    ("az://container/prefix", "unsupported scheme"),
    ("file:///tmp/data", "unsupported scheme"),
    ("file://bucket/x", "unsupported scheme"),
    ("http://bucket/x", "unsupported scheme"),
    ("https://storage.googleapis.com/bucket", "unsupported scheme"),
    ("S3://bucket", "unsupported scheme"),
    ("gcs://bucket", "unsupported scheme"),
    ("s3:/bucket", "no scheme"),
    ("s3:bucket", "no scheme"),
    ("s3://", "no bucket"),
    ("s3:///prefix", "no bucket"),
    # bucket names
    ("s3://ab", "invalid bucket name"),
    ("s3://Bucket", "invalid bucket name"),
    ("s3://my_bucket", "invalid bucket name"),
    ("s3://" + "b" * 64, "invalid bucket name"),
    ("gs://" + "b" * 64, "invalid bucket name"),
    ("gs://" + "a" * 64 + ".b", "invalid bucket name"),
    ("s3://a..b", "invalid bucket name"),
    ("s3://-abc", "invalid bucket name"),
    ("s3://abc-", "invalid bucket name"),
    ("s3://192.168.1.1", "invalid bucket name"),
    ("s3://abc:9000/x", "invalid bucket name"),
    ("s3://user@abc/x", "invalid bucket name"),
    ("s3://abc?x=1", "invalid bucket name"),
    ("s3://abc#frag", "invalid bucket name"),
    ("s3://abc\n/x", "invalid bucket name"),
    ("s3://ab c/x", "invalid bucket name"),
    # prefix characters
    ("s3://bucket/pre fix", "characters outside"),
    ("s3://bucket/a%2e%2e", "characters outside"),
    ("gs://bucket/a\\b", "characters outside"),
    ("s3://bucket/caf\u00e9", "characters outside"),
    ("s3://bucket/x\n/y", "characters outside"),
    ("s3://bucket/a?b", "characters outside"),
    ("s3://bucket/a*b", "characters outside"),
    ("s3://bucket/a:b", "characters outside"),
    # dot segments
    ("s3://bucket/..", "'.' or '..'"),
    ("s3://bucket/../other", "'.' or '..'"),
    ("s3://bucket/a/../../b", "'.' or '..'"),
    ("gs://bucket/./a", "'.' or '..'"),
    ("gs://bucket/a/.", "'.' or '..'"),
    ("gs://bucket/a//./b", "'.' or '..'"),
]


@pytest.mark.parametrize(("text", "reason"), REJECTED)
def test_rejected_specs_name_the_accepted_forms(text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bucket_spec(text)
    message = str(info.value)
    assert reason in message
    assert _names_forms(message), message


def test_non_string_spec_is_rejected() -> None:
    with pytest.raises(ConfigError):
        parse_bucket_spec(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("", ""), ("/", ""), ("a", "a"), ("/a/", "a"), ("a//b", "a/b"), ("//a///b//c//", "a/b/c")],
)
def test_normalise_prefix(prefix: str, expected: str) -> None:
    assert normalise_prefix(prefix) == expected


@pytest.mark.parametrize("prefix", ["a\n", "a/\n", "..", "a/./b", "a b", "a\x00"])
def test_normalise_prefix_rejects(prefix: str) -> None:
    with pytest.raises(ConfigError):
        normalise_prefix(prefix)


# --- dialect options ------------------------------------------------------------------

GS = parse_bucket_spec("gs://fleet-bucket/prod")
S3 = parse_bucket_spec("s3://fleet-bucket/prod")

OPTION_ERRORS: list[tuple[BucketSpec, StoreOptions, dict[str, str], str]] = [
    (GS, StoreOptions(endpoint="http://127.0.0.1:9000"), {}, "endpoint"),
    (GS, StoreOptions(), {"AWS_ENDPOINT_URL": "http://minio:9000"}, "AWS_ENDPOINT_URL"),
    (GS, StoreOptions(), {"AWS_ENDPOINT_URL_S3": "http://minio:9000"}, "AWS_ENDPOINT_URL_S3"),
    (GS, StoreOptions(access_key="AKIA", secret_key="s"), {}, "credentials"),
    (GS, StoreOptions(access_key="AKIA"), {}, "credentials"),
    (GS, StoreOptions(secret_key="s"), {}, "credentials"),
    (GS, StoreOptions(region="eu-west-1", access_key="AKIA", secret_key="s"), {}, "credentials"),
    (S3, StoreOptions(access_key="AKIA"), {}, "both"),
    (S3, StoreOptions(secret_key="s"), {}, "both"),
]


@pytest.mark.parametrize(("spec", "options", "env", "needle"), OPTION_ERRORS)
def test_forbidden_option_combinations(
    spec: BucketSpec, options: StoreOptions, env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_options(spec, options, env)
    assert needle in str(info.value)


OPTION_OK: list[tuple[BucketSpec, StoreOptions, dict[str, str]]] = [
    (GS, StoreOptions(), {}),
    (GS, StoreOptions(region="eu-west-1"), {}),  # ignored for GCS
    (GS, StoreOptions(), {"AWS_ENDPOINT_URL": ""}),
    (GS, StoreOptions(), {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}),
    (S3, StoreOptions(), {}),
    (S3, StoreOptions(endpoint="http://127.0.0.1:9000", region="eu-west-1"), {}),
    (S3, StoreOptions(access_key="AKIA", secret_key="s"), {}),
    (S3, StoreOptions(), {"AWS_ENDPOINT_URL": "http://minio:9000"}),
]


@pytest.mark.parametrize(("spec", "options", "env"), OPTION_OK)
def test_allowed_option_combinations(
    spec: BucketSpec, options: StoreOptions, env: dict[str, str]
) -> None:
    check_options(spec, options, env)


@pytest.mark.parametrize(
    ("options", "env"),
    [
        (StoreOptions(endpoint="http://127.0.0.1:9000"), {}),
        (StoreOptions(), {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}),
        (StoreOptions(access_key="AKIA", secret_key="s"), {}),
    ],
)
def test_open_bucket_refuses_gcs_with_s3_settings(
    options: StoreOptions, env: dict[str, str]
) -> None:
    with pytest.raises(ConfigError):
        open_bucket("gs://fleet-bucket/prod", options, env)


@pytest.mark.parametrize("text", ["az://c/x", "file:///tmp/x", "bucket", "", "s3://bucket/../x"])
def test_open_bucket_refuses_bad_specs(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_bucket(text, StoreOptions(), {})
    assert _names_forms(str(info.value))


def test_open_bucket_s3_takes_endpoint_from_options_then_env() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    from_env = open_bucket("s3://fleet-bucket//prod/", StoreOptions(), env)
    assert isinstance(from_env, S3Bucket)
    assert (from_env.bucket, from_env.prefix, from_env.endpoint) == (
        "fleet-bucket",
        "prod",
        "http://127.0.0.1:1",
    )
    assert from_env.spec == "s3://fleet-bucket/prod"
    explicit = open_bucket("s3://fleet-bucket", StoreOptions(endpoint="http://127.0.0.1:2"), env)
    assert isinstance(explicit, S3Bucket) and explicit.endpoint == "http://127.0.0.1:2"


def test_open_bucket_gcs_ignores_region_and_works(fake_gcs: str) -> None:
    opened = open_bucket("gs://spec-open-test//prod//", StoreOptions(region="eu-west-1"), {})
    assert isinstance(opened, GcsBucket)
    assert (opened.bucket, opened.prefix, opened.spec) == (
        "spec-open-test",
        "prod",
        "gs://spec-open-test/prod",
    )
    opened.ensure_exists()
    token = opened.put("k", b"v")
    got = opened.get("k")
    assert got is not None and (got.body, got.token) == (b"v", token)
    raw = GcsBucket("spec-open-test")
    assert [o.key for o in raw.list("")] == ["prod/k"]


# --- cell ids -------------------------------------------------------------------------

VALID_CELL_IDS = [
    "A:b",
    "Counter:user-42",
    "Account:acct_0001",
    "pkg.Mod:v1.2",
    "Doc:a:b:c",
    "Wallet:$main",
    "C:..",
    "C:-",
    "C:" + "x" * 253,
]


@pytest.mark.parametrize("cell_id", VALID_CELL_IDS)
def test_valid_cell_ids(cell_id: str) -> None:
    assert keys.validate_cell_id(cell_id) == cell_id
    assert keys.owner_key(cell_id) == f"cells/{cell_id}/own.json"
    assert keys.seal_key(cell_id, 3) == f"cells/{cell_id}/e3.seal.json"
    assert keys.batch_key(cell_id, 2, 1, 16) == (f"cells/{cell_id}/e2/{1:016x}-{16:016x}.batch")


INVALID_CELL_IDS: list[Any] = [
    "",
    ".",
    "..",
    ":",
    "A",
    "A:",
    ":b",
    "A:b/c",
    "A:b/../../x",
    "../../etc:passwd",
    "A:..%2F..",
    "A:b\\c",
    "A:b\n",
    "A:b\nnodes/evil.json",
    "\nA:b",
    "A:b\r",
    "A:b\x00",
    "A:b c",
    "A:b\t",
    "A:b?c",
    "A:b#c",
    "A:b*",
    "A:b&c=d",
    "A:caf\u00e9",
    "A:\u0430",  # Cyrillic a
    "A:" + "x" * 254,  # 256 bytes
    123,
    None,
    b"A:b",
]


@pytest.mark.parametrize("cell_id", INVALID_CELL_IDS)
def test_invalid_cell_ids_are_rejected_before_any_key(cell_id: Any) -> None:
    with pytest.raises(InvalidCellId):
        keys.validate_cell_id(cell_id)
    with pytest.raises(InvalidCellId):
        keys.owner_key(cell_id)
    with pytest.raises(InvalidCellId):
        keys.snapshot_key(cell_id, 1, 1)


def test_invalid_cell_id_is_a_config_error_naming_the_rule() -> None:
    with pytest.raises(ConfigError) as info:
        keys.validate_cell_id("A:b/c")
    assert "[A-Za-z0-9_.:$-]" in str(info.value)
    with pytest.raises(ConfigError) as info:
        keys.validate_cell_id("Ab")
    assert "<Class>:<name>" in str(info.value)


@pytest.mark.parametrize(
    ("cls_name", "name", "ok"),
    [
        ("A", "b", True),
        ("Counter", "x:y", True),
        ("", "b", False),
        ("A:B", "c", False),
        ("A", "", False),
        ("A", "../x", False),
    ],
)
def test_make_cell_id(cls_name: str, name: str, ok: bool) -> None:
    if ok:
        assert keys.make_cell_id(cls_name, name) == f"{cls_name}:{name}"
    else:
        with pytest.raises(InvalidCellId):
            keys.make_cell_id(cls_name, name)


@pytest.mark.parametrize("node_id", ["n1", "node-1.eu_west", "a" * 128])
def test_valid_node_ids(node_id: str) -> None:
    assert keys.lease_key(node_id) == f"nodes/{node_id}.json"


@pytest.mark.parametrize(
    "node_id", ["", ".", "..", "n/1", "n1\n", "n:1", "n 1", "a" * 129, "../cells/x"]
)
def test_invalid_node_ids(node_id: str) -> None:
    with pytest.raises(InvalidCellId):
        keys.lease_key(node_id)
