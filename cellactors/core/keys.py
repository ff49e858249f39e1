"""Every key the library writes, built in one place after the cell id is validated.

Keys are relative to the fleet prefix (the bucket adds it). See docs/protocol.md, "The bucket
layout".
"""

from __future__ import annotations

import hashlib
import re

from cellactors.errors import InvalidCellId

# Used with fullmatch: a pattern ending in "$" would also accept a trailing newline.
_CELL_ID_RE = re.compile(r"[A-Za-z0-9_.:$-]{1,255}")
_NODE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def validate_cell_id(cell_id: str) -> str:
    """Return ``cell_id`` if it is ``<Class>:<name>`` with allowed characters, else raise."""
    if not isinstance(cell_id, str):
        raise InvalidCellId(f"cell id must be a string, not {type(cell_id).__name__}")
    if cell_id in (".", "..") or not _CELL_ID_RE.fullmatch(cell_id):
        raise InvalidCellId(
            f"invalid cell id {cell_id!r}: use 1-255 characters from [A-Za-z0-9_.:$-], "
            "never '.' or '..'"
        )
    cls, sep, name = cell_id.partition(":")
    if not sep or not cls or not name:
        raise InvalidCellId(f"invalid cell id {cell_id!r}: expected <Class>:<name>")
    return cell_id


def make_cell_id(cls_name: str, name: str) -> str:
    """Build and validate the cell id for class ``cls_name`` and instance ``name``.

    The name must not be ``.`` or ``..``: they are path segments in an HTTP route and in
    local file names, so every entry point (HTTP, ``Node.call``, ``Node.cell``) refuses them
    here."""
    if not cls_name or ":" in cls_name or cls_name in (".", ".."):
        raise InvalidCellId(f"invalid class name {cls_name!r} for a cell id")
    if name in (".", ".."):
        raise InvalidCellId(f"invalid cell id {cls_name}:{name}: the name may not be {name!r}")
    return validate_cell_id(f"{cls_name}:{name}")


def validate_node_id(node_id: str) -> str:
    """Node ids become ``nodes/<node>.json``; keep them to a safe alphabet."""
    if not isinstance(node_id, str) or node_id in (".", "..") or not _NODE_ID_RE.fullmatch(node_id):
        raise InvalidCellId(
            f"invalid node id {node_id!r}: use 1-128 characters from [A-Za-z0-9_.-]"
        )
    return node_id


def cell_root(cell_id: str) -> str:
    return f"cells/{validate_cell_id(cell_id)}/"


def owner_key(cell_id: str) -> str:
    return cell_root(cell_id) + "own.json"


def epoch_dir(cell_id: str, epoch: int) -> str:
    return cell_root(cell_id) + f"e{epoch}/"


def batch_key(cell_id: str, epoch: int, first: int, last: int) -> str:
    return epoch_dir(cell_id, epoch) + f"{first:016x}-{last:016x}.batch"


def seal_key(cell_id: str, epoch: int) -> str:
    return cell_root(cell_id) + f"e{epoch}.seal.json"


def snapshot_key(cell_id: str, txid: int, epoch: int) -> str:
    """The epoch is part of the name, so snapshots written at different epochs can never
    replace one another, and a restore can skip unusable ones without reading them."""
    return cell_root(cell_id) + f"snap/{txid:016x}.e{epoch}.snap"


#: A local file name never exceeds this many bytes (NAME_MAX of ext4, xfs, btrfs, tmpfs, APFS).
LOCAL_NAME_MAX = 255
#: Room left for what SQLite appends to a database's name ("-journal", "-wal", "-shm"), with
#: some to spare.
_SQLITE_SUFFIX_ROOM = 16
#: The longest epoch part of a local name (epochs are below 2**63 by far).
_EPOCH_PART_MAX = len(f".e{2**63}.db")
#: Cell ids up to this long name their local files themselves; longer ones by a digest.
LOCAL_ID_MAX = LOCAL_NAME_MAX - _SQLITE_SUFFIX_ROOM - _EPOCH_PART_MAX


def local_db_name(cell_id: str, epoch: int) -> str:
    """The local file name of ``cell_id``'s database at ``epoch``: ``<cell>.e<epoch>.db``
    while that fits in :data:`LOCAL_NAME_MAX` bytes with SQLite's suffixes, else
    ``<class, cut to 64>#<sha256 of the id>.e<epoch>.db``. Every local path derived from a
    cell id comes from here. The two forms never meet: a cell id always has a ``:``, a
    digest name never does (nor can an id hold a ``#``), and the epoch is the digits after
    the last ``.e``."""
    validate_cell_id(cell_id)
    suffix = f".e{epoch}.db"
    if len(cell_id) + len(suffix) + _SQLITE_SUFFIX_ROOM <= LOCAL_NAME_MAX:
        return cell_id + suffix
    digest = hashlib.sha256(cell_id.encode("ascii")).hexdigest()
    return f"{cell_id.partition(':')[0][:64]}#{digest}{suffix}"


def lease_key(node_id: str) -> str:
    return f"nodes/{validate_node_id(node_id)}.json"


NODES_PREFIX = "nodes/"
PEER_AUTH_KEY = "fleet/peer-auth.json"
PROBE_PREFIX = "probe/"
