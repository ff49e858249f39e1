"""Signed requests from an operator's command to a node's internal listener (``cellactors
dead-letters``, ``cellactors rollback``).

The requests are signed with the fleet key, as peer calls are, so a command reads the key
from the bucket (the store options), or from the nodes' keyring (``--peer-key-file``), and
needs the internal address of a node (``--node``). A node that does not own the cell answers
with the owner's internal address, and the command asks that node instead (once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import httpx

from cellactors.cli.failures import EXIT_FAILURE, CommandFailed, store_failure
from cellactors.cli.store_options import PEER_KEY_FILE_ENV, StoreArgs
from cellactors.core import keys
from cellactors.errors import BucketError, CellactorsError, ConfigError
from cellactors.server import signing

NODE_ENV = "CELLACTORS_NODE_URL"
#: The source the command signs as (a label: the node checks the signature, not the name).
SOURCE = "operator"
#: Where the --peer-key-file option leaves its value in the click context.
PEER_KEY_META = "cellactors.peer_key_file"


def node_option(f: Any) -> Any:
    f = click.option(
        "--node",
        "node_url",
        required=True,
        envvar=NODE_ENV,
        show_envvar=True,
        metavar="URL",
        help="A node's internal listener, e.g. http://10.0.3.17:8081.",
    )(f)
    f = click.option("--cell", "cell_id", required=True, metavar="CLASS:NAME", help="The cell.")(f)
    f = click.option(
        "--peer-key-file",
        envvar=PEER_KEY_FILE_ENV,
        show_envvar=True,
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        expose_value=False,  # kept in the context: only the signing key needs it
        callback=lambda ctx, _param, value: ctx.meta.__setitem__(PEER_KEY_META, value),
        help="The nodes' peer keyring (serve --peer-key-file): sign with its first key "
        "instead of the fleet key in the bucket.",
    )(f)
    return click.option(
        "--timeout",
        default=40.0,
        show_default=True,
        type=click.FloatRange(min=0.1),
        metavar="SECONDS",
        help="How long to wait for the node (it may activate the cell first).",
    )(f)


class Operator:
    """Signed requests to nodes' internal listeners, under the fleet key in the bucket."""

    def __init__(self, store: StoreArgs, timeout: float) -> None:
        self.key = _fleet_key(store)
        self.http = httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0))

    def send(
        self, node_url: str, cell_id: str, method: str, suffix: str, body: bytes = b""
    ) -> dict[str, Any]:
        """``method`` on ``/cells/{cls}/{name}{suffix}`` at ``node_url`` (``body``: JSON), or
        at the owner it names; the decoded answer, or :class:`CommandFailed`."""
        try:
            keys.validate_cell_id(cell_id)
        except CellactorsError as err:
            raise CommandFailed(str(err)) from err
        base = node_url.rstrip("/")
        try:
            for hop in (1, 2):
                node, generation = self._identity(base)
                url_path, headers = signing.operator_request(
                    self.key,
                    method,
                    cell_id,
                    suffix,
                    body,
                    source=SOURCE,
                    target=node,
                    target_generation=generation,
                )
                resp = self.http.request(method, base + url_path, headers=headers, content=body)
                payload = _decoded(resp)
                if resp.is_success:
                    return payload
                if resp.status_code == 409 and payload.get("error") == "remote_owner" and hop == 1:
                    addr = str(payload.get("addr", ""))
                    base = addr if "://" in addr else f"http://{addr}"
                    continue
                raise CommandFailed(
                    f"{base}: {payload.get('error', resp.status_code)}: "
                    f"{payload.get('message', resp.text[:200])}",
                    EXIT_FAILURE,
                )
        except httpx.HTTPError as err:
            raise CommandFailed(f"{base} could not be asked: {err!r}", EXIT_FAILURE) from err
        raise CommandFailed(f"{cell_id} moved again while it was being asked", EXIT_FAILURE)

    def _identity(self, base: str) -> tuple[str, str]:
        """The node id and process generation at ``base`` (its ``/healthz``), which the
        signature names."""
        payload = _decoded(self.http.get(base + "/healthz"))
        node, generation = payload.get("node"), payload.get("generation")
        if not isinstance(node, str) or not isinstance(generation, str):
            raise CommandFailed(f"{base} is not a cellactors internal listener", EXIT_FAILURE)
        return node, generation


def _decoded(resp: httpx.Response) -> dict[str, Any]:
    try:
        payload = resp.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _fleet_key(store: StoreArgs) -> bytes:
    """The key nodes accept: the first key of the keyring ``--peer-key-file`` names (the
    nodes' own flag and variable); else the fleet key from the bucket (read only)."""
    from cellactors.persistence.control.peer_auth import read_peer_key

    context = click.get_current_context(silent=True)
    keyring: Path | None = context.meta.get(PEER_KEY_META) if context is not None else None
    if keyring is not None:
        from cellactors.server.peer_keys import parse_keyring

        try:
            return parse_keyring(keyring.read_text(encoding="utf-8"), str(keyring)).signing
        except OSError as err:
            raise CommandFailed(f"cannot read {keyring}: {err.strerror}") from err
        except ConfigError as err:
            raise CommandFailed(str(err)) from err

    bucket = store.open()
    try:
        key = read_peer_key(bucket)
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    finally:
        bucket.close()
    if key is None:
        raise CommandFailed(f"{store.bucket} has no fleet key: no node has served from it")
    return key
