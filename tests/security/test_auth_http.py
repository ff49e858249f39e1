"""Who may call what, through real listeners: two nodes served by the real runner on one
SeaweedFS bucket, with API keys. Every refusal is 401 or 403, outcome ``not_run``, before
the cell is activated (nothing of it in the bucket); the caller a method sees is the one
the first node authenticated, through a forward, a call between cells and the outbox."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import cellactors
from cellactors import CellActor, Principal
from cellactors.core import keys
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from tests.helpers.fleet import COUNTER_APP, NodeProc
from tests.helpers.runtime import eventually
from tests.helpers.served import ServedNode, served_node

KEYS = {
    "ak_alice_0123456789abcdef": {"principal": "alice", "roles": ["user"]},
    "ak_bob_0123456789abcdef01": {"principal": "bob", "roles": ["user"]},
    "ak_root_0123456789abcdef0": {"principal": "root", "roles": ["admin"]},
    "ak_feed_0123456789abcdef0": {"principal": "reader", "roles": ["feed"]},
}
ALICE, BOB, ROOT, FEED = list(KEYS)


def who(caller: Principal | None) -> dict[str, Any] | None:
    return None if caller is None else {"name": caller.name, "roles": sorted(caller.roles)}


class Vault(CellActor):
    """One vault per tenant: a caller may open only the vault named after them."""

    @classmethod
    def authorize(cls, caller: Principal | None, name: str, method: str) -> bool:
        return caller is not None and (caller.name == name or "admin" in caller.roles)

    def on_activate(self) -> None:
        self.db.table("notes").create({"seq": int, "by": str}, pk="seq", if_not_exists=True)

    def whoami(self) -> dict[str, Any] | None:
        return who(self.caller)

    def ask(self, other: str) -> Any:
        return self.cell(Ledger, other).whoami()

    def note_later(self, other: str) -> str:
        return self.send(Ledger, other, "note")

    @cellactors.allow("admin")
    def wipe(self) -> None:
        self.db.execute("DELETE FROM notes")


class Ledger(CellActor):
    """Shared by everyone who is authenticated."""

    def on_activate(self) -> None:
        self.db.table("n").create({"id": int, "v": int}, pk="id", if_not_exists=True)
        self.db.table("by").create({"seq": int, "who": str}, pk="seq", if_not_exists=True)

    @cellactors.public
    def hello(self) -> str:
        return "hello"

    def whoami(self) -> dict[str, Any] | None:
        return who(self.caller)

    def increment(self) -> int:
        self.db.execute(
            "INSERT INTO n (id, v) VALUES (1, 1) ON CONFLICT(id) DO UPDATE SET v = v + 1"
        )
        return int(self.db.execute("SELECT v FROM n WHERE id = 1").fetchone()[0])

    def note(self) -> None:
        caller = self.caller
        self.db.execute("INSERT INTO by (who) VALUES (?)", [caller.name if caller else "-"])

    def notes(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT who FROM by ORDER BY seq")]


@dataclass
class Pair:
    a: ServedNode
    b: ServedNode
    bucket: S3Bucket
    http: httpx.Client

    def post(
        self,
        node: ServedNode,
        path: str,
        key: str | None = None,
        idem: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        headers = {"content-type": "application/json"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        if idem is not None:
            headers["idempotency-key"] = idem
        return self.http.post(node.public + "/cells/" + path, json=kwargs, headers=headers)


@pytest.fixture
def pair(sw_bucket: S3Bucket, tmp_path: Path) -> Iterator[Pair]:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    settings = ServerSettings(authentication=Authentication([ApiKeys(path)]))
    classes = (Vault, Ledger)
    with (
        served_node(sw_bucket, "a", settings, classes) as a,
        served_node(sw_bucket, "b", settings, classes) as b,
        httpx.Client(timeout=30) as http,
    ):
        yield Pair(a, b, sw_bucket, http)


def refusal(r: httpx.Response) -> tuple[int, str, str]:
    return r.status_code, r.json()["error"], r.json()["outcome"]


def nothing_of(bucket: S3Bucket, cell_id: str) -> bool:
    return not list(bucket.list(keys.cell_root(cell_id)))


def test_refusals_are_401_or_403_not_run_and_leave_no_trace(pair: Pair) -> None:
    # Anonymous: only the public method.
    assert pair.post(pair.a, "Ledger/l1/hello").json() == {"result": "hello"}
    assert refusal(pair.post(pair.a, "Vault/alice/whoami")) == (401, "unauthenticated", "not_run")
    # A wrong key is refused even where anonymous callers are welcome.
    assert refusal(pair.post(pair.a, "Ledger/l1/hello", key="ak_nobody_0123456789ab")) == (
        401,
        "unauthenticated",
        "not_run",
    )
    # Alice may not open bob's vault, nor wipe her own (admins only).
    assert refusal(pair.post(pair.a, "Vault/bob/whoami", key=ALICE)) == (
        403,
        "forbidden",
        "not_run",
    )
    assert refusal(pair.post(pair.a, "Vault/alice/wipe", key=ALICE)) == (
        403,
        "forbidden",
        "not_run",
    )
    assert nothing_of(pair.bucket, "Vault:alice") and nothing_of(pair.bucket, "Vault:bob")
    # Root may.
    assert pair.post(pair.a, "Vault/bob/wipe", key=ROOT).status_code == 200


def test_a_method_sees_its_caller_through_a_forward_a_call_between_cells_and_the_outbox(
    pair: Pair,
) -> None:
    alice = {"name": "alice", "roles": ["user"]}
    assert pair.post(pair.a, "Vault/alice/whoami", key=ALICE).json() == {"result": alice}
    assert pair.a.node.activations.active("Vault:alice") is not None
    # Through b: forwarded, signed, to a, the owner.
    r = pair.post(pair.b, "Vault/alice/whoami", key=ALICE)
    assert r.json() == {"result": alice} and r.headers["x-cellactors-node"] == "a"
    # A ledger living on b, called from alice's vault on a: the callee sees alice.
    assert pair.post(pair.b, "Ledger/onb/whoami", key=BOB).headers["x-cellactors-node"] == "b"
    assert pair.post(pair.a, "Vault/alice/ask", key=ALICE, other="onb").json() == {"result": alice}
    # A message sent by alice's call is delivered on her behalf.
    assert pair.post(pair.a, "Vault/alice/note_later", key=ALICE, other="onb").status_code == 200
    eventually(lambda: pair.post(pair.b, "Ledger/onb/notes", key=BOB).json()["result"] == ["alice"])


def test_idempotency_keys_are_the_callers_own(pair: Pair) -> None:
    first = pair.post(pair.a, "Ledger/shared/increment", key=ALICE, idem="order-17")
    other = pair.post(pair.a, "Ledger/shared/increment", key=BOB, idem="order-17")
    again = pair.post(pair.a, "Ledger/shared/increment", key=ALICE, idem="order-17")
    assert (first.json(), other.json(), again.json()) == (
        {"result": 1},
        {"result": 2},  # bob's key is bob's: it ran
        {"result": 1},  # alice's again: answered from her record
    )


def test_the_change_feed_needs_the_feed_role(pair: Pair) -> None:
    # One call: it creates the call log in the same transaction (a schema change), and its
    # rows show all the same, the call log's to admins only.
    assert pair.post(pair.a, "Ledger/fed/increment", key=ALICE, idem="k-1").status_code == 200
    url = pair.a.public + "/cells/Ledger/fed/changes?after=0"

    def get(key: str | None) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return pair.http.get(url, headers=headers)

    assert refusal(get(None)) == (401, "unauthenticated", "not_run")
    assert refusal(get(ALICE)) == (403, "forbidden", "not_run")

    def tables(key: str) -> set[str]:
        r = get(key)
        assert r.status_code == 200
        records = [json.loads(line) for line in r.text.splitlines()]
        return {c["table"] for rec in records for c in rec["changes"]}

    # The call log (every caller's idempotency keys) is for admins only.
    assert "n" in tables(FEED) and "_cellactors_calls" not in tables(FEED)
    assert {"n", "_cellactors_calls"} <= tables(ROOT)


def test_browsers_of_allowed_origins_only_get_a_preflight(sw_bucket: S3Bucket) -> None:
    settings = ServerSettings(cors_origins=("http://app.example",))
    with served_node(sw_bucket, "c", settings, (Ledger,)) as c, httpx.Client() as http:
        url = c.public + "/cells/Ledger/x/hello"

        def preflight(origin: str) -> httpx.Response:
            return http.options(
                url,
                headers={
                    "origin": origin,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "content-type, authorization",
                },
            )

        ok = preflight("http://app.example")
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "http://app.example"
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        bad = preflight("http://evil.example")
        assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
        call = http.post(
            url,
            json={},
            headers={"origin": "http://app.example", "content-type": "application/json"},
        )
        assert call.json() == {"result": "hello"}
        assert call.headers["access-control-allow-origin"] == "http://app.example"


def test_an_open_public_listener_beyond_loopback_is_refused_at_start(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cellactors.cli import main
    from cellactors.errors import ConfigError
    from cellactors.server.runner import Runner
    from tests.helpers.fake_node import KEY, FakeNode

    with pytest.raises(ConfigError, match="--allow-anonymous"):
        Runner(FakeNode(), KEY, public=("0.0.0.0", 0))
    Runner(FakeNode(), KEY, public=("0.0.0.0", 0), settings=ServerSettings(allow_anonymous=True))
    args = ["serve", "--app", "examples/counter.py", "--data-dir", str(tmp_path / "d")]
    args += ["--listen", "0.0.0.0:0", "--internal-listen", "127.0.0.1:1"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2, refused.output
    assert "--allow-anonymous" in refused.output
    assert not (tmp_path / "d").exists()  # refused before anything was started


@pytest.mark.fleet
def test_a_served_process_with_an_api_keys_file_admits_only_its_keys(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    """``cellactors serve --api-keys``: a real process refuses anonymous and unknown callers
    (401, not_run), serves a key's holder, and takes a key added to the file without a
    restart."""
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({ALICE: {"principal": "alice"}}))
    proc = NodeProc("authn", COUNTER_APP, tmp_path, f"s3://{sw_bucket.bucket}", seaweed.endpoint)
    proc.extra = ["--api-keys", str(keys_file)]
    proc.start()
    try:
        proc.ready()
        url = proc.public_url + "/cells/Counter/a/increment"

        def increment(key: str | None) -> httpx.Response:
            headers = {"content-type": "application/json"}
            if key:
                headers["authorization"] = f"Bearer {key}"
            return httpx.post(url, json={"name": "n"}, headers=headers, timeout=30)

        assert refusal(increment(None)) == (401, "unauthenticated", "not_run")
        assert refusal(increment(BOB)) == (401, "unauthenticated", "not_run")
        assert nothing_of(sw_bucket, "Counter:a")
        assert increment(ALICE).json() == {"result": 1}
        keys_file.write_text(json.dumps({ALICE: {"principal": "alice"}, BOB: {"principal": "b"}}))
        assert eventually(lambda: increment(BOB).status_code == 200)
        assert "ak_" not in proc.output()  # no key ever reaches the log
    finally:
        proc.kill()


def test_authentication_adds_no_bucket_request_to_a_call(pair: Pair, sw_bucket: S3Bucket) -> None:
    """The ack path of an authenticated call is the open node's, request for request."""

    def spent(node: ServedNode, path: str, key: str | None) -> dict[tuple[str, str], int]:
        assert pair.post(node, path, key=key).status_code == 200  # the cell is active
        before = node.node.bucket.snapshot()
        assert pair.post(node, path, key=key).status_code == 200
        after = node.node.bucket.snapshot()
        after.subtract(before)
        return {k: v for k, v in after.items() if v and k[1] != "lease"}

    authenticated = spent(pair.a, "Ledger/acks/increment", ALICE)
    with served_node(sw_bucket, "open", classes=(Ledger,)) as open_node:
        anonymous = spent(open_node, "Ledger/acks2/increment", None)
    assert authenticated == anonymous and sum(authenticated.values()) >= 1


def test_the_answer_guards_own_answers_carry_cors_headers_too() -> None:
    """An unexpected failure is answered by the answer guard (500, outcome unknown): a page
    of an allowed origin must be able to read it, not see a network error."""
    from starlette.testclient import TestClient

    from cellactors.server.app import build_public_app
    from tests.helpers.fake_node import KEY, FakeNode

    node = FakeNode("node-a")

    def broken(cell_id: str) -> Any:
        raise RuntimeError("a bug")

    node.feed_reader = broken  # type: ignore[method-assign]
    app = build_public_app(node, KEY, ServerSettings(cors_origins=("http://a.example",)))
    cls = sorted(node.classes)[0]
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get(f"/cells/{cls}/x/changes", headers={"origin": "http://a.example"})
    assert (r.status_code, r.json()["outcome"]) == (500, "unknown")
    assert r.headers["access-control-allow-origin"] == "http://a.example"
