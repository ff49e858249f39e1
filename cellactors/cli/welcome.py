"""What ``cellactors serve`` says once it serves: where to go next. The listeners as URLs,
the fleet page and ``/metrics``, a ``curl`` that calls a method of the app, and for the
embedded store how to point boto3 or the AWS CLI at it (the secret stays in its file)."""

from __future__ import annotations

import inspect
import json
import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellactors.actors.cell import CellActor
from cellactors.cli.embedded_store import EMBEDDED_BUCKET
from cellactors.persistence.store.embedded_keys import CREDENTIALS_FILE
from cellactors.server.runner import url

if TYPE_CHECKING:
    from cellactors.persistence.store.embedded import SeaweedServer

log = logging.getLogger("cellactors.serve")


@dataclass(frozen=True)
class EmbeddedStore:
    """What a user needs to reach the embedded store from outside the node."""

    endpoint: str
    bucket: str
    access_key_id: str
    credentials_file: Path


def _placeholder(param: inspect.Parameter) -> Any:
    """An example value for a required argument, by its annotation."""
    kind = str(param.annotation).lower()
    if "int" in kind or "float" in kind:
        return 1
    if "bool" in kind:
        return True
    if "list" in kind:
        return []
    if "dict" in kind:
        return {}
    return "x"


def example_call(public_url: str, classes: Sequence[type[CellActor]]) -> str:
    """A ``curl`` calling the first method (by name) of the first class, with an example
    value for each of its required arguments."""
    cls = classes[0]
    method = sorted(cls.exposed_methods())[0]
    body: dict[str, Any] = {}
    for name, param in inspect.signature(getattr(cls, method)).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty:
            body[name] = _placeholder(param)
    return (
        f"curl -X POST {public_url}/cells/{cls.__name__}/example/{method} "
        f"-H 'content-type: application/json' -d {shlex.quote(json.dumps(body))}"
    )


def next_steps(
    public: tuple[str, int],
    internal: tuple[str, int],
    classes: Sequence[type[CellActor]],
    store: EmbeddedStore | None = None,
) -> list[str]:
    """The lines ``serve`` prints when it starts serving."""
    public_url, internal_url = url(public), url(internal)
    lines = [
        f"public listener:   {public_url}  (calls: POST /cells/<Class>/<name>/<method>; "
        f"API docs: {public_url}/docs)",
        f"internal listener: {internal_url}  (fleet page: {internal_url}/ ; "
        f"metrics: {internal_url}/metrics)",
        f"try: {example_call(public_url, classes)}",
    ]
    if store is not None:
        secret = (
            "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))"
            f'["secret_access_key"])\' {shlex.quote(str(store.credentials_file))})'
        )
        lines += [
            f"embedded store: s3://{store.bucket} at {store.endpoint}; to reach it with "
            "boto3 or the AWS CLI:",
            f"  export AWS_ENDPOINT_URL={store.endpoint} AWS_DEFAULT_REGION=us-east-1",
            f"  export AWS_ACCESS_KEY_ID={store.access_key_id}",
            f"  export AWS_SECRET_ACCESS_KEY={secret}",
            f"  aws s3 ls s3://{store.bucket}/",
        ]
    return lines


def announce(
    classes: Sequence[type[CellActor]], server: SeaweedServer | None
) -> Callable[[tuple[str, int], tuple[str, int]], None]:
    """The runner's ``on_ready``: log :func:`next_steps` (one record a line, so that
    ``--log-format json`` keeps one object a line)."""
    store = None
    if server is not None:
        store = EmbeddedStore(
            server.endpoint,
            EMBEDDED_BUCKET,
            server.credentials.access_key_id,
            server.keys_dir / CREDENTIALS_FILE,
        )

    def tell(public: tuple[str, int], internal: tuple[str, int]) -> None:
        for line in next_steps(public, internal, classes, store):
            log.info("%s", line)

    return tell
