"""``cellactors qualify`` and the qualification logic, against SeaweedFS and the S3 fake."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from cellactors.cli import main
from cellactors.cli.qualify_verdict import (
    EXIT_DISQUALIFIED,
    EXIT_INCOMPLETE,
    EXIT_QUALIFIED,
    verdict,
)
from cellactors.persistence.store.bucket import (
    Bucket,
    CasResult,
    Guard,
    ObjectInfo,
    Rejected,
    StoredObject,
)
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.memory import MemoryBucket
from cellactors.persistence.store.qualify import (
    RoundResult,
    run_contract,
    run_hammer,
    run_listing,
)
from cellactors.persistence.store.s3 import S3Bucket
from tests.faults.proxy import FaultProxy
from tests.helpers.s3_fake import FakeS3
from tests.helpers.stores import new_bucket_name

# Small runs: SeaweedFS makes losers of a race wait, so every round costs about a second.
WRITERS = 4
ROUNDS = 3


@pytest.fixture
def fake_bucket() -> Iterator[Callable[[str], tuple[FakeS3, S3Bucket]]]:
    """Start a fake in the given mode with one empty bucket; stop them all afterwards."""
    fakes: list[FakeS3] = []

    def make(mode: str) -> tuple[FakeS3, S3Bucket]:
        fake = FakeS3(mode).start()
        fakes.append(fake)
        fake.create_bucket("qualify")
        return fake, S3Bucket("qualify", endpoint=fake.endpoint, timeout=5.0)

    yield make
    for fake in fakes:
        fake.stop()


def _qualify_args(bucket: S3Bucket, *extra: str) -> list[str]:
    assert bucket.endpoint is not None
    return [
        "qualify",
        "--bucket",
        bucket.spec,
        "--endpoint",
        bucket.endpoint,
        "--writers",
        str(WRITERS),
        "--rounds",
        str(ROUNDS),
        *extra,
    ]


def _invoke(args: list[str]) -> Result:
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _probe_keys(bucket: Bucket) -> list[str]:
    return [info.key for info in bucket.list("")]


# --------------------------------------------------------------------------- SeaweedFS


def test_qualify_passes_on_seaweedfs(sw_bucket: S3Bucket) -> None:
    result = _invoke(_qualify_args(sw_bucket))
    assert result.exit_code == EXIT_QUALIFIED, result.output
    line = _last_line(result.stdout)
    assert line.startswith("QUALIFIED (exit 0)")
    assert f"all {2 * ROUNDS} rounds of {WRITERS} writers" in line
    assert "contract held (4 steps)" in result.stdout
    assert "hammer:" in result.stderr  # the progress bar goes to stderr
    assert _probe_keys(sw_bucket) == []


def test_qualify_passes_on_seaweedfs_as_a_real_process(
    seaweed: SeaweedServer, sw_bucket: S3Bucket
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cellactors.cli", *_qualify_args(sw_bucket)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _last_line(proc.stdout).startswith("QUALIFIED (exit 0)")
    assert _probe_keys(sw_bucket) == []


def test_qualify_fails_on_a_bucket_that_does_not_exist(seaweed: SeaweedServer) -> None:
    missing = S3Bucket(new_bucket_name(), endpoint=seaweed.endpoint, timeout=5.0)
    assert not missing.exists()
    proc = subprocess.run(
        [sys.executable, "-m", "cellactors.cli", *_qualify_args(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    assert _last_line(proc.stderr) == (
        f"error: bucket {missing.spec} does not exist; create it first (or check its name)"
    )
    assert "QUALIFIED" not in proc.stdout
    assert not missing.exists(), "qualify created the bucket it was asked about"


def test_contract_holds_on_seaweedfs_and_cleans_up(sw_bucket: S3Bucket) -> None:
    report = run_contract(sw_bucket)
    assert report.ok, report.summary()
    assert [s.name for s in report.steps] == [
        "create",
        "create-again",
        "update",
        "update-stale",
    ]
    assert _probe_keys(sw_bucket) == []


@pytest.mark.parametrize("store", ["seaweed", "gcs"])
def test_listings_show_every_write_and_delete_at_once(
    store: str, sw_bucket: S3Bucket, request: pytest.FixtureRequest
) -> None:
    bucket: Bucket = sw_bucket if store == "seaweed" else request.getfixturevalue("gcs_bucket")
    report = run_listing(bucket)
    assert report.ok, report.summary()
    assert report.listings == 10  # one after each of 5 PUTs and 5 DELETEs
    assert _probe_keys(bucket) == []


def test_qualify_exits_1_on_a_store_whose_listings_lag(
    proxy: FaultProxy, sw_bucket: S3Bucket
) -> None:
    """Listings that leave out what was written in the last 5 s: a crash takeover would
    restore from such a listing and seal acknowledged writes away."""
    proxy.lag_listings(5.0)
    lagging = S3Bucket(sw_bucket.bucket, endpoint=proxy.endpoint)
    result = _invoke(_qualify_args(lagging))
    assert result.exit_code == EXIT_DISQUALIFIED, result.output
    assert "list-after-write: listings lag: the listing right after PUT" in result.stdout
    line = _last_line(result.stdout)
    assert line.startswith("NOT QUALIFIED (exit 1): listings lag behind writes"), line
    assert "seal acknowledged writes away" in line
    assert _probe_keys(sw_bucket) == []


class SkippingPages(MemoryBucket):
    """A store whose listing continuation drops every second page."""

    def list_pages(self, prefix: str, page_size: int) -> Iterator[list[ObjectInfo]]:
        everything = list(self.list(prefix))
        for number, start in enumerate(range(0, len(everything), page_size)):
            yield everything[start : start + page_size] if number % 2 == 0 else []


def test_a_listing_that_loses_objects_across_pages_is_caught() -> None:
    report = run_listing(SkippingPages("pages"))
    assert not report.ok
    assert "lacks probe/" in report.problems[0]


# --------------------------------------------------------------------------- fakes


def test_qualify_exits_1_on_a_store_that_ignores_preconditions(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("ignore")
    result = _invoke(_qualify_args(bucket))
    assert result.exit_code == EXIT_DISQUALIFIED, result.output
    for phase in ("create", "update"):
        for number in range(1, ROUNDS + 1):
            assert f"{phase} round {number}: {WRITERS} winners" in result.stdout
    assert "If-None-Match not enforced" in result.stdout
    line = _last_line(result.stdout)
    assert line.startswith("NOT QUALIFIED (exit 1)")
    assert f"{2 * ROUNDS} rounds without exactly one winner" in line
    assert fake.objects("qualify") == {}


def test_qualify_exits_2_on_a_store_answering_500(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("error500")
    result = _invoke(_qualify_args(bucket))
    assert result.exit_code == EXIT_INCOMPLETE, result.output
    line = _last_line(result.stdout)
    assert line.startswith("NOT QUALIFIED (exit 2)")
    assert "500" in line and "AmbiguousWrite" in line
    assert fake.objects("qualify") == {}
    assert len([r for r in fake.requests if r.method == "PUT" and r.conditional]) == 1


def test_qualify_exits_2_when_the_connection_drops_after_commit(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("drop_after_commit")
    result = _invoke(_qualify_args(bucket))
    assert result.exit_code == EXIT_INCOMPLETE, result.output
    assert fake.objects("qualify") == {}  # the committed probe object was cleaned up


def test_qualify_passes_on_an_enforcing_store_that_only_matches_bare_etags(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("unquoted_only")
    result = _invoke(_qualify_args(bucket))
    assert result.exit_code == EXIT_QUALIFIED, result.output
    assert fake.objects("qualify") == {}


def test_hammer_stops_at_the_first_round_with_an_error(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("error500")
    seen: list[RoundResult] = []
    report = run_hammer(bucket, writers=3, rounds=5, progress=seen.append)
    assert not report.completed and report.error is not None
    assert "InternalError" in report.error
    assert [(r.phase, r.number, len(r.errors)) for r in report.results] == [("create", 1, 3)]
    assert seen == report.results
    assert verdict(run_contract(bucket), report).code == EXIT_INCOMPLETE
    assert fake.objects("qualify") == {}


def test_hammer_counts_every_round_and_reports_progress(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("enforce")
    seen: list[RoundResult] = []
    report = run_hammer(bucket, writers=5, rounds=4, progress=seen.append)
    assert report.ok and report.completed
    assert [(r.phase, r.number) for r in seen] == [
        (phase, n) for phase in ("create", "update") for n in range(1, 5)
    ]
    assert all(r.winners == 1 and r.rejected == 4 for r in seen)
    # Every writer raced exactly one conditional PUT per round.
    assert len([r for r in fake.requests if r.method == "PUT" and r.conditional]) == 5 * 8
    assert fake.objects("qualify") == {}


class _WritesDespite412(Bucket):
    """A store that answers 412 to a losing conditional PUT but writes its body anyway."""

    def __init__(self, inner: S3Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec

    def get(self, key: str) -> StoredObject | None:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        return self.inner.put(key, body)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        result = self.inner.put_cas(key, body, guard)
        if isinstance(result, Rejected):
            self.inner.put(key, body)
        return result

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def test_a_rejected_write_that_lands_anyway_disqualifies(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, inner = fake_bucket("enforce")
    bucket = _WritesDespite412(inner)
    contract = run_contract(bucket)
    assert contract.completed and not contract.ok
    assert {s.name for s in contract.steps if not s.ok} == {"create-again", "update-stale"}
    hammer = run_hammer(bucket, writers=3, rounds=2)
    assert hammer.completed
    assert [r.winners for r in hammer.results] == [1, 1, 1, 1]
    assert all(r.problem and "not what the store holds" in r.problem for r in hammer.bad_rounds)
    assert len(hammer.bad_rounds) == 4
    result = verdict(contract, hammer)
    assert result.code == EXIT_DISQUALIFIED
    assert "create-again" in result.line
    assert fake.objects("qualify") == {}


def test_contract_reports_broken_steps_on_an_ignoring_store(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("ignore")
    report = run_contract(bucket)
    assert report.completed and not report.ok
    assert {s.name for s in report.steps if not s.ok} == {"create-again", "update-stale"}
    assert verdict(report, None).code == EXIT_DISQUALIFIED
    assert fake.objects("qualify") == {}


def test_contract_that_cannot_create_is_disqualifying_not_incomplete(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    _, bucket = fake_bucket("conflict409")
    report = run_contract(bucket)
    assert report.completed and not report.ok
    assert [s.name for s in report.steps] == ["create"]
    assert verdict(report, None).code == EXIT_DISQUALIFIED


def test_contract_only_verdict_says_the_hammer_did_not_run(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    _, bucket = fake_bucket("enforce")
    result = verdict(run_contract(bucket), None)
    assert result.code == EXIT_QUALIFIED
    assert "only the contract ran" in result.line


def test_a_missing_bucket_is_exit_2() -> None:
    fake = FakeS3("enforce").start()
    try:
        result = _invoke(
            ["qualify", "--bucket", "s3://no-such-bucket", "--endpoint", fake.endpoint]
        )
    finally:
        fake.stop()
    assert result.exit_code == EXIT_INCOMPLETE, result.output
    assert _last_line(result.stderr) == (
        "error: bucket s3://no-such-bucket does not exist; create it first (or check its name)"
    )
    assert "qualifying" not in result.stdout  # nothing was written or run


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bucket", "az://container"], "s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"),
        (["--bucket", "my-bucket"], "s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"),
        (["--bucket", "gs://gcs-bucket", "--endpoint", "http://127.0.0.1:9"], "S3 endpoint"),
        (
            ["--bucket", "gs://gcs-bucket", "--access-key-id", "a", "--secret-access-key", "b"],
            "S3 static credentials",
        ),
        (["--bucket", "s3://s3-bucket", "--access-key-id", "only-half"], "both"),
    ],
)
def test_bad_bucket_specs_and_options_exit_2_with_a_clear_message(
    args: list[str], message: str
) -> None:
    result = _invoke(["qualify", *args])
    assert result.exit_code == EXIT_INCOMPLETE
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_static_credentials_pass_through(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("enforce")
    args = _qualify_args(bucket, "--access-key-id", "AKIDEXAMPLE", "--secret-access-key", "s")
    result = _invoke([*args, "--region", "eu-west-1"])
    assert result.exit_code == EXIT_QUALIFIED, result.output
    signed = {(r.access_key, r.region) for r in fake.requests}
    assert signed == {("AKIDEXAMPLE", "eu-west-1")}
