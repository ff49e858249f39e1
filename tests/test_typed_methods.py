"""Typed methods: arguments checked against annotations (400 ``not_run`` naming the field,
before any activation), converted for the method, and results dumped by their type, over
HTTP and in process; unannotated methods behave as before."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pydantic
import pytest
from click.testing import CliRunner
from openapi_spec_validator import validate
from typing_extensions import TypedDict

from cellactors import CellActor
from cellactors.cli import main as cli_main
from cellactors.errors import BadRequest
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.served import ServedNode, served_node


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Span(TypedDict):
    start: int
    end: int


class Person(pydantic.BaseModel):
    name: str
    age: int


class Typed(CellActor):
    """One method per type family; each answers what it received, typed."""

    def ints(self, a: int, b: float, s: str, flag: bool, raw: bytes) -> list[Any]:
        assert type(a) is int and type(b) is float and isinstance(raw, bytes)
        return [a, b, s, flag, len(raw)]

    def containers(self, xs: list[int], d: dict[str, int], o: int | None = None) -> dict[str, Any]:
        return {"xs": xs, "d": d, "o": o}

    def choice(self, mode: Literal["a", "b"], colour: Colour) -> Colour:
        assert isinstance(colour, Colour)
        return colour

    def when(self, at: datetime.datetime, id: uuid.UUID) -> datetime.datetime:
        assert isinstance(at, datetime.datetime) and isinstance(id, uuid.UUID)
        return at + datetime.timedelta(days=1)

    def shapes(self, p: Point, span: Span, who: Person) -> Point:
        assert isinstance(p, Point) and isinstance(who, Person)
        return Point(p.x + span["end"], p.y + who.age)

    def person(self, name: str) -> Person:
        return Person(name=name, age=3)

    def plain(self, x, y=2):  # type: ignore[no-untyped-def]
        return [x, y]


class Caller(CellActor):
    """Calls :class:`Typed` from inside its own method, with a bad argument."""

    def call_bad(self) -> str:
        try:
            self.cell(Typed, "callee").containers(xs=["no"], d={})
        except BadRequest as err:
            return f"{err.outcome}: {err}"
        return "ran"

    def send_bad(self) -> str:
        try:
            self.send(Typed, "callee", "containers", xs=["no"], d={})
        except BadRequest as err:
            return f"{err.outcome}: {err}"
        return "sent"

    def messages(self) -> int:
        """Rows in the outbox (made with the first message, so none yet is none)."""
        if "_cellactors_outbox" not in self.db.table_names():
            return 0
        return int(self.db.execute("SELECT count(*) FROM _cellactors_outbox").fetchone()[0])


@pytest.fixture
def served(sw_bucket: S3Bucket) -> Iterator[ServedNode]:
    with served_node(sw_bucket, "n1", classes=[Typed]) as s:
        yield s


def _post(s: ServedNode, method: str, body: dict[str, Any], name: str = "a") -> httpx.Response:
    return httpx.post(f"{s.public}/cells/Typed/{name}/{method}", json=body, timeout=30)


ROUND_TRIPS: list[tuple[str, dict[str, Any], Any]] = [
    ("containers", {"xs": [1, 2], "d": {"k": 1}}, {"xs": [1, 2], "d": {"k": 1}, "o": None}),
    ("containers", {"xs": [], "d": {}, "o": 4}, {"xs": [], "d": {}, "o": 4}),
    ("choice", {"mode": "a", "colour": "blue"}, "blue"),
    (
        "when",
        {"at": "2026-01-02T03:04:05+00:00", "id": str(uuid.UUID(int=7))},
        "2026-01-03T03:04:05Z",
    ),
    (
        "shapes",
        {"p": {"x": 1, "y": 2}, "span": {"start": 0, "end": 10}, "who": {"name": "n", "age": 5}},
        {"x": 11, "y": 7},
    ),
    ("person", {"name": "ann"}, {"name": "ann", "age": 3}),
    ("plain", {"x": "anything"}, ["anything", 2]),
]


def test_each_type_family_round_trips_over_http(served: ServedNode) -> None:
    for method, body, expected in ROUND_TRIPS:
        resp = _post(served, method, body)
        assert resp.status_code == 200, (method, resp.text)
        assert resp.json()["result"] == expected, method


@pytest.mark.parametrize(
    ("method", "body", "field", "expected"),
    [
        ("containers", {"xs": ["no"], "d": {}}, "xs.0", "int"),
        ("choice", {"mode": "c", "colour": "red"}, "mode", "Literal"),
        ("choice", {"mode": "a", "colour": "green"}, "colour", "Colour"),
        ("when", {"at": "yesterday", "id": str(uuid.UUID(int=1))}, "at", "datetime"),
        ("shapes", {"p": {"x": 1}, "span": {"start": 0, "end": 1}, "who": {}}, "p.y", "Point"),
    ],
)
def test_bad_argument_is_400_not_run_and_creates_nothing(
    served: ServedNode,
    sw_bucket: S3Bucket,
    method: str,
    body: dict[str, Any],
    field: str,
    expected: str,
) -> None:
    resp = _post(served, method, body, name="never")
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert err["error"] == "bad_request" and err["outcome"] == "not_run"
    assert repr(field) in err["message"] and expected in err["message"], err["message"]
    assert [o.key for o in sw_bucket.list("") if "never" in o.key] == []


def test_in_process_calls_are_checked_and_answer_the_wire_form(sw_bucket: S3Bucket) -> None:
    with served_node(sw_bucket, "n1", classes=[Typed]) as s:
        cell: Any = s.node.cell(Typed, "b")
        assert cell.shapes(
            p={"x": 1, "y": 1}, span={"start": 0, "end": 1}, who={"name": "n", "age": 1}
        ) == {"x": 2, "y": 2}
        assert cell.person(name="bo") == {"name": "bo", "age": 3}
        assert cell.plain(x=[1]) == [[1], 2]
        with pytest.raises(BadRequest, match=r"'xs\.0'"):
            cell.containers(xs=["x"], d={})


def test_openapi_document_is_valid_and_lists_methods_with_schemas(served: ServedNode) -> None:
    resp = httpx.get(f"{served.public}/openapi.json", timeout=30)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    validate(doc)
    shapes = doc["paths"]["/cells/Typed/{name}/shapes"]["post"]
    body = shapes["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["p", "span", "who"]
    assert body["properties"]["p"]["title"] == "Point"
    assert body["properties"]["p"]["required"] == ["x", "y"]
    assert body["properties"]["span"]["properties"]["end"]["type"] == "integer"
    assert "Error" in doc["components"]["schemas"]
    assert "Idempotency-Key" in [p["name"] for p in shapes["parameters"]]
    when = doc["paths"]["/cells/Typed/{name}/when"]["post"]["responses"]["200"]
    result = when["content"]["application/json"]["schema"]["properties"]["result"]
    assert result == {"type": "string", "format": "date-time"}
    assert "security" not in doc  # an open node


def test_openapi_offline_names_the_bearer_scheme() -> None:
    out = CliRunner().invoke(cli_main, ["openapi", "--app", "tests.test_typed_methods", "--bearer"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    validate(doc)
    assert doc["security"] == [{"bearer": []}]
    assert "/cells/Typed/{name}/plain" in doc["paths"]


def test_calls_between_cells_are_checked_before_the_callee_activates(
    sw_bucket: S3Bucket,
) -> None:
    with served_node(sw_bucket, "n1", classes=[Typed, Caller]) as s:
        answer = s.node.cell(Caller, "c").call_bad()
        assert answer.startswith("not_run: ") and "'xs.0'" in answer, answer
        assert [o.key for o in sw_bucket.list("") if "callee" in o.key] == []


def test_a_message_with_a_bad_typed_argument_fails_its_sender_and_is_not_recorded(
    sw_bucket: S3Bucket,
) -> None:
    with served_node(sw_bucket, "n1", classes=[Typed, Caller]) as s:
        answer = s.node.cell(Caller, "c").send_bad()
        assert answer.startswith("not_run: ") and "'xs.0'" in answer, answer
        assert s.node.cell(Caller, "c").messages() == 0
