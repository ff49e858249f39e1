"""The OpenAPI document of a served app, checked against the node that serves it:
schemathesis sends the calls the document describes (valid ones, and invalid ones) to a real
node on loopback, and every answer must be no 5xx and conform to the document (status, media
type, body, headers). The document also names every error answer with its outcome class,
and on a node with authentication the bearer scheme (optional for ``@public`` methods)."""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import hypothesis
import pytest
import schemathesis
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis import checks as st_checks
from schemathesis.core.result import Ok
from typing_extensions import TypedDict

import cellactors
from cellactors import CellActor
from cellactors.cli import main as cli_main
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import handling
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from cellactors.server.openapi import build_openapi
from cellactors.server.openapi_errors import CALL_ERRORS, schema_name
from tests.helpers.served import ServedNode, served_node
from tests.test_typed_methods import Typed

#: What every answer must pass: no 5xx, and conform to the document in every way.
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
]
#: Examples per operation and generation mode: the whole run takes seconds.
EXAMPLES = 12


class Receipt(TypedDict):
    data: bytes
    at: datetime.datetime


class Wallet(CellActor):
    """A small typed app: a balance kept in the cell's database, bytes both ways, a method
    that refuses, a read-only one and a public one."""

    def on_activate(self) -> None:
        self.db.table("moves").create({"seq": int, "amount": int}, pk="seq", if_not_exists=True)

    def deposit(self, amount: int, memo: str = "") -> int:
        """Add ``amount`` (more than 0) and answer the new balance."""
        if amount <= 0:
            raise ValueError("a deposit is more than 0")
        self.db.table("moves").insert({"amount": amount})
        return self.balance()

    @cellactors.read_only
    def balance(self) -> int:
        """The sum of every deposit."""
        if "moves" not in self.db.table_names():
            return 0
        return int(self.db.execute("SELECT coalesce(sum(amount), 0) FROM moves").fetchone()[0])

    def stamp(self, data: bytes, mark: Literal["!", "?"] = "!") -> bytes:
        """``data`` with ``mark`` after it."""
        return data + mark.encode()

    def receipt(self, data: bytes, at: datetime.datetime) -> Receipt:
        """``data`` and when: a result msgpack cannot carry whole (a datetime), so its JSON
        form is answered, with the bytes as a string."""
        return {"data": data, "at": at}

    @cellactors.public
    def quote(self, price: decimal.Decimal, within: datetime.timedelta) -> dict[str, Any]:
        """Anyone may ask for a quote."""
        return {"price": price, "until": within}

    @cellactors.allow("admin")
    def close(self) -> None:
        """Only admins close a wallet."""


@pytest.fixture
def served(sw_bucket: S3Bucket) -> Iterator[ServedNode]:
    with served_node(sw_bucket, "n1", classes=[Typed, Wallet]) as s:
        yield s


def _each_case(op: Any, mode: GenerationMode, run: Callable[[Any], None]) -> None:
    """``run`` on ``EXAMPLES`` cases of ``op`` in ``mode``, the same ones every time."""

    @hypothesis.given(case=op.as_strategy(mode))
    @hypothesis.settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    def each(case: Any) -> None:
        run(case)

    each()


def test_every_generated_call_answers_no_5xx_and_conforms(served: ServedNode) -> None:
    schema = schemathesis.openapi.from_url(f"{served.public}/openapi.json")
    checks = [getattr(st_checks, name) for name in CHECKS]
    operations = [op.ok() for op in schema.get_all_operations() if isinstance(op, Ok)]
    assert len(operations) == 13  # every method of both classes
    answered: dict[str, set[int]] = {}  # statuses by operation

    def run(case: Any) -> None:
        answer = case.call_and_validate(base_url=served.public, checks=checks)
        answered.setdefault(case.operation.label, set()).add(answer.status_code)

    for op in operations:
        for mode in ("positive", "negative"):  # valid calls, and invalid ones
            _each_case(op, GenerationMode(mode), run)
    # The run reached every method, and its refusals in front of them too.
    assert [label for label, codes in answered.items() if {200, 400} <= codes] == sorted(
        op.label for op in operations
    ), answered


def test_the_document_is_built_once_per_node(
    served: ServedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built.append(1)
        return build_openapi(*args, **kwargs)

    monkeypatch.setattr(handling, "build_openapi", counted)
    answers = [httpx.get(f"{served.public}/openapi.json", timeout=30) for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    assert answers[0].content == answers[2].content
    assert answers[0].headers["content-type"] == "application/json"
    assert len(built) == 1


def _document(node: ServedNode, **headers: str) -> dict[str, Any]:
    answer = httpx.get(f"{node.public}/openapi.json", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    validate(doc)
    return doc


def test_every_error_answer_is_described_with_its_code_and_outcome(served: ServedNode) -> None:
    doc = _document(served)
    schemas = doc["components"]["schemas"]
    deposit = doc["paths"]["/cells/Wallet/{name}/deposit"]["post"]
    for cls in CALL_ERRORS:
        fixed = schemas[schema_name(cls.code)]["properties"]
        assert fixed["error"] == {"const": cls.code}
        assert fixed["outcome"] == {"const": cls.outcome}, cls.code
        assert fixed["retryable"] == {"const": cls.retryable}, cls.code
        answer = deposit["responses"][str(cls.status)]
        assert f"`{cls.code}` ({cls.outcome})" in answer["description"]
        assert json.dumps({"$ref": f"#/components/schemas/{schema_name(cls.code)}"}) in (
            json.dumps(answer["content"]["application/json"]["schema"])
        )
    assert schemas["Error"]["required"] == ["error", "message", "outcome", "retryable"]
    assert schemas[schema_name("method_failed")]["required"] == ["type", "detail"]
    assert "Retry-After" in deposit["responses"]["503"]["headers"]
    # An open node refuses no caller: no 401 or 403, no security scheme.
    assert "401" not in deposit["responses"] and "403" not in deposit["responses"]
    assert "securitySchemes" not in doc["components"] and "security" not in deposit
    # The wire forms: bytes as {"$bytes": base64} in JSON, integers within 64 bits.
    stamp = doc["paths"]["/cells/Wallet/{name}/stamp"]["post"]
    ok = stamp["responses"]["200"]["content"]["application/json"]["schema"]
    bytes_ = {"anyOf": [{"$ref": "#/components/schemas/Bytes"}, {"type": "string"}]}
    assert ok["properties"]["result"] == bytes_
    assert schemas["Bytes"]["required"] == ["$bytes"]
    body = deposit["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["amount"]["maximum"] == 2**64 - 1
    assert body["required"] == ["amount"] and body["additionalProperties"] is False
    assert body["properties"]["memo"]["default"] == ""  # a default, in its JSON form
    mark = stamp["requestBody"]["content"]["application/json"]["schema"]["properties"]["mark"]
    assert mark == {"enum": ["!", "?"], "type": "string", "default": "!"}


KEYS = {"ak_user_0123456789abcdef01": {"principal": "ann", "roles": ["user"]}}


def test_an_authenticating_node_describes_its_bearer_scheme_and_refusals(
    sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    settings = ServerSettings(authentication=Authentication([ApiKeys(path)]))
    with served_node(sw_bucket, "n1", settings, classes=[Wallet]) as node:
        doc = _document(node)  # no credential: the document is public
        # `cellactors openapi --bearer` prints the very document, offline.
        printed = CliRunner().invoke(cli_main, ["openapi", "--app", __name__, "--bearer"])
        assert printed.exit_code == 0, printed.output
        assert json.loads(printed.output) == doc
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        paths = doc["paths"]
        quote = paths["/cells/Wallet/{name}/quote"]["post"]
        deposit = paths["/cells/Wallet/{name}/deposit"]["post"]
        close = paths["/cells/Wallet/{name}/close"]["post"]
        assert quote["security"] == [{}, {"bearer": []}]  # @public: anonymous callers too
        assert deposit["security"] == [{"bearer": []}]
        assert "`admin`" in close["description"]
        for status, code in (("401", "unauthenticated"), ("403", "forbidden")):
            assert f"`{code}` (not_run)" in deposit["responses"][status]["description"]
        # What the node answers conforms to what it describes, refusals included.
        schema = schemathesis.openapi.from_dict(doc)
        calls: list[tuple[str, dict[str, Any], dict[str, str], int]] = [
            ("quote", {"price": "1.5", "within": "PT1H"}, {}, 200),
            ("deposit", {"amount": 2}, {}, 401),
            ("deposit", {"amount": 2}, {"authorization": "Bearer ak_nobody_0123456789ab"}, 401),
            ("deposit", {"amount": 2}, {"authorization": f"Bearer {next(iter(KEYS))}"}, 200),
            ("close", {}, {"authorization": f"Bearer {next(iter(KEYS))}"}, 403),
        ]
        for method, body, headers, expected in calls:
            answer = httpx.post(
                f"{node.public}/cells/Wallet/w/{method}", json=body, headers=headers, timeout=30
            )
            assert answer.status_code == expected, (method, answer.text)
            operation = schema[f"/cells/Wallet/{{name}}/{method}"]["POST"]
            operation.validate_response(answer)  # raises when it does not conform
