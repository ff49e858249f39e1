"""``cellactors serve``: run one node of a fleet.

Start-up order: check the flags, import the app, open the bucket (or start the embedded
single-machine store), run the four-step conditional-write probe (refuse a store that fails
it), fetch or create the fleet's peer key, take the node lease, then serve the public and
internal listeners until SIGTERM (drain, exit 0) or a self-fence (``SELF-FENCE:`` line,
exit 3). Every flag can also be set as ``CELLACTORS_<FLAG>``.

The listen addresses are bound (and held, without listening) before the store is touched,
so a port in use fails at once (exit 6) without a bucket write; the servers then listen on
those same sockets. Exit codes (docs/cli.md):
0 stopped cleanly, 1 unexpected failure, 2 bad configuration or an unusable store (one
that fails the probe included), 3 self-fenced, 4 no usable store credentials, 5 store
unreachable, 6 a listen address cannot be bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

from cellactors.cli.auth_options import Access, AuthArgs, auth_options
from cellactors.cli.embedded_store import start_embedded_store
from cellactors.cli.failures import (
    EXIT_ADDRESS_IN_USE,
    EXIT_CONFIG,
    EXIT_FENCED,
    EXIT_OK,
    CommandFailed,
    store_failure,
)
from cellactors.cli.listeners import (
    DEFAULT_INTERNAL,
    DEFAULT_LISTEN,
    Listeners,
    ListenerUnavailable,
    StartupError,
    default_node_id,
    plan_listeners,
    reserve_listeners,
)
from cellactors.cli.log_format import LOG_FORMATS, setup_logging
from cellactors.cli.serve_options import DURATION, app_option, env_option, envvar, wire_options
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.errors import CellactorsError, ConfigError
from cellactors.persistence.files import private_dir
from cellactors.persistence.store.bucket import Bucket

log = logging.getLogger("cellactors.serve")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_DATA_DIR = "./cellactors-data"


class _Interrupted(Exception):
    """SIGTERM/SIGINT arrived before the node was serving."""


@contextlib.contextmanager
def _startup_signals() -> Iterator[None]:
    """Until serving starts, SIGTERM/SIGINT abort the start-up cleanly (finally blocks run)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command("serve")
@app_option(envvar=envvar("app"), show_envvar=True)
@store_options(
    required=False,
    bucket_help="s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]; without it an embedded "
    "single-machine store runs under --data-dir (not a fleet).",
)
@env_option(
    "--node",
    "node_id",
    default=None,
    metavar="ID",
    help="Node id, stable across restarts [host name].",
)
@env_option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="Public listener (client calls).",
)
@env_option(
    "--internal-listen",
    default=None,
    metavar="HOST:PORT",
    help=f"Internal listener (peers, /state, /metrics) [{DEFAULT_INTERNAL}]; "
    "required when --listen is not loopback.",
)
@env_option(
    "--advertise",
    default=None,
    metavar="HOST:PORT",
    help="Internal address peers use to reach this node [the internal listen address].",
)
@env_option(
    "--internal-host",
    "internal_hosts",
    multiple=True,
    metavar="NAME",
    help="A name the internal listener answers to in Host, besides loopback names, the "
    "address it listens on and the advertised one (repeatable; fnmatch patterns such as "
    "*.peers.ns.svc allowed): any other Host is refused, against DNS rebinding.",
)
@auth_options()
@env_option(
    "--peer-key-file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Sign and check peer calls with these keys (one per line, 64 hex digits; the first "
    "signs, all are accepted; read again when it changes) instead of the fleet key in the "
    "bucket: rotation without downtime, and bucket readers cannot sign peer calls.",
)
@env_option(
    "--data-dir",
    default=DEFAULT_DATA_DIR,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Local cell databases (and the embedded store).",
)
@env_option(
    "--lease-ttl",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    metavar="SECONDS",
    help="Node lease TTL in seconds; a dead node's cells move after this long.",
)
@env_option(
    "--max-clock-skew",
    default=None,
    type=click.FloatRange(min=0.0),
    metavar="SECONDS",
    help="Largest allowed offset between this machine's wall clock and the store's (from "
    "the Date of its answers): beyond it the node refuses to start, and warns once running; "
    "leases and alarms follow the store's clock either way [lease TTL / 4].",
)
@env_option(
    "--max-resident-cells",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    metavar="N",
    help="Active cells this node hosts before placing new ones on peers.",
)
@env_option(
    "--idle-timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    metavar="SECONDS",
    help="Seconds without a call before a cell is released (passivated).",
)
@env_option(
    "--hibernate-after",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    metavar="SECONDS",
    help="Seconds without a call before a cell hibernates: it keeps its ownership and file "
    "but holds no thread or connection, and wakes with no bucket request (off when not "
    "below --idle-timeout).",
)
@env_option(
    "--alarm-scan-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    metavar="SECONDS",
    help="Seconds between scans of the bucket for due alarms of cells no node hosts (one "
    "LIST request each when nothing is due); alarms of cells this node released fire "
    "within a second regardless.",
)
@env_option(
    "--snapshot-every",
    default=1000,
    show_default=True,
    type=click.IntRange(min=1),
    metavar="TXIDS",
    help="Snapshot a cell when this many transactions were written since its last snapshot "
    "(counted across activations); a snapshot bounds the next restore.",
)
@env_option(
    "--retention",
    default="7d",
    show_default=True,
    type=DURATION,
    metavar="DURATION",
    help="Keep the history a snapshot covers this long before collecting it, so the change "
    "feed and point-in-time restore reach back that far (e.g. 7d, 12h, 30m, 0 to collect at "
    "once).",
)
@env_option(
    "--outbox-max-attempts",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    metavar="N",
    help="An outbox message is a dead letter after this many deliveries refused because "
    "the target serves no such class or method (at once when refused for good, or when its "
    "method raised).",
)
@env_option(
    "--outbox-max-age",
    default="1h",
    show_default=True,
    type=DURATION,
    metavar="DURATION",
    help="... or once it has been undelivered this long, for any reason (e.g. 1h, 30m).",
)
@wire_options()
@env_option(
    "--debug",
    is_flag=True,
    default=False,
    help="Debug mode: a failed method's error answer carries the node's traceback. Never "
    "in production: it shows your code to every caller.",
)
@env_option(
    "--otlp-endpoint",
    default=None,
    metavar="URL",
    help="Send traces (OpenTelemetry, OTLP/HTTP) to this collector, e.g. "
    "http://127.0.0.1:4318; OTEL_EXPORTER_OTLP_ENDPOINT is honoured too. Off without "
    "either. Needs pip install 'cellactors[otel]'.",
)
@env_option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@env_option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
    help="text, or json: one JSON object per line (time, level, logger, message, exception).",
)
def serve(
    app: str,
    store: StoreArgs,
    node_id: str | None,
    listen: str,
    internal_listen: str | None,
    advertise: str | None,
    internal_hosts: tuple[str, ...],
    auth: AuthArgs,
    peer_key_file: Path | None,
    data_dir: Path,
    lease_ttl: float,
    max_clock_skew: float | None,
    max_resident_cells: int,
    idle_timeout: float,
    hibernate_after: float,
    alarm_scan_interval: float,
    snapshot_every: int,
    retention: float,
    outbox_max_attempts: int,
    outbox_max_age: float,
    wire: dict[str, Any],
    debug: bool,
    otlp_endpoint: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the cells of APP as one node: exit 0 after SIGTERM, 3 on self-fence, 2 when
    the configuration or the store is unusable, 4 without usable store credentials, 5 when
    the store is unreachable, 6 when a listen address is in use."""
    from cellactors.actors.node import NodeSettings
    from cellactors.actors.snapshots import SnapshotPolicy
    from cellactors.cli.app_loader import load_app
    from cellactors.core import keys
    from cellactors.server.auth.authentication import check_exposure
    from cellactors.server.peer_keys import keyring_file

    setup_logging(log_level, log_format)
    from cellactors.actors.limits import max_active_cells, raise_open_files_limit

    soft, _hard = raise_open_files_limit()
    log.info("open-files limit %d: room for about %d active cells", soft, max_active_cells())
    try:
        listeners = plan_listeners(listen, internal_listen, advertise)
        node = keys.validate_node_id(node_id or default_node_id())
        classes = load_app(app)
        authentication = auth.authentication()
        peer_keys = keyring_file(peer_key_file) if peer_key_file is not None else None
        auth.check_cors()
        check_exposure(authentication, listeners.public.host, auth.allow_anonymous)
        settings = NodeSettings(
            debug=debug,
            lease_ttl=lease_ttl,
            max_clock_skew=max_clock_skew,
            idle_timeout=idle_timeout,
            hibernate_timeout=hibernate_after,
            alarm_scan_interval=alarm_scan_interval,
            snapshots=SnapshotPolicy(every_txids=snapshot_every, retain_s=retention),
            max_resident_cells=max_resident_cells,
            advertise=str(listeners.advertise),
            data_dir=data_dir,
            outbox_max_attempts=outbox_max_attempts,
            outbox_max_age=outbox_max_age,
        )
        stop_tracing = _start_tracing(otlp_endpoint, node)
    except (StartupError, ConfigError) as err:
        raise CommandFailed(str(err)) from err
    log.info("serving cell classes: %s", ", ".join(c.__name__ for c in classes))
    log.info("public listener authentication: %s", authentication.describe())
    access = Access(
        authentication, auth.allow_anonymous, auth.cors_origins, internal_hosts, peer_keys
    )
    code = _run(store, node, classes, settings, listeners, wire, data_dir, access)
    if code == EXIT_FENCED:
        _exit_now(code)  # at once: the spans still batched are not waited for
    stop_tracing()  # flushes the spans still batched (for a few seconds at most)
    sys.exit(code)


def _start_tracing(flag: str | None, node_id: str) -> Callable[[], None]:
    """Turn tracing on when an endpoint is configured (cellactors.tracing.export); the
    function that flushes and stops it (one that does nothing when it is off)."""
    from cellactors.tracing import export

    url = export.traces_url(flag)
    if url is None:
        return lambda: None
    stop = export.install(url, node_id)
    log.info("sending traces to %s", url)
    return stop


def _exit_now(code: int) -> NoReturn:
    """Exit without joining worker threads: a fenced node abandons requests that hang
    (an upload retrying, a lease write) instead of waiting for them at interpreter exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(
    store: StoreArgs,
    node_id: str,
    classes: list[Any],
    settings: Any,
    listeners: Listeners,
    wire: dict[str, Any],
    data_dir: Path,
    access: Access,
) -> int:
    """Open the store, qualify it, take the lease and serve; the exit code. ``wire`` holds
    the :class:`ServerSettings` of the limits on the wire (body size included)."""
    from cellactors.actors.node import Node
    from cellactors.cli.data_dir_lock import hold_data_dir
    from cellactors.cli.welcome import announce
    from cellactors.persistence.control.peer_auth import ensure_peer_key
    from cellactors.persistence.store.embedded import SeaweedServer
    from cellactors.server.app import ServerSettings
    from cellactors.server.runner import FenceLatch, serve_node

    embedded: SeaweedServer | None = None
    bucket: Bucket | None = None
    node: Node | None = None
    held: dict[str, socket.socket] = {}
    code: int = EXIT_OK
    try:
        with _startup_signals():
            hold_data_dir(data_dir)  # first: a second serve names the first one's pid
            held = reserve_listeners(listeners)
            if store.bucket is None:
                embedded, bucket = _start_embedded(store, data_dir)
            else:
                bucket = store.open()
            _probe(bucket)
            key = access.peer_keys or ensure_peer_key(bucket)
            latch = FenceLatch()
            node = Node(bucket, node_id, classes, settings, on_fence=latch.trip)
            log.info(
                "node %s taking its lease in %s (advertising %s, TTL %gs)",
                node_id,
                bucket.spec,
                listeners.advertise,
                settings.lease_ttl,
            )
            node.start()
        server_settings = ServerSettings(
            **wire,
            call_timeout=settings.call_timeout,
            internal_hosts=access.internal_hosts,
            authentication=access.authentication,
            allow_anonymous=access.allow_anonymous,
            cors_origins=access.cors_origins,
            debug=settings.debug,
        )
        public, internal = listeners.public, listeners.internal
        code = serve_node(
            node,
            key,
            public=(public.host, public.port),
            internal=(internal.host, internal.port),
            settings=server_settings,
            fence=latch,
            sockets=held,
            on_ready=announce(classes, embedded),
        )
    except ListenerUnavailable as err:
        click.echo(f"error: {err}", err=True)
        code = EXIT_ADDRESS_IN_USE
    except StartupError as err:
        click.echo(f"error: {err}", err=True)
        code = EXIT_CONFIG
    except CommandFailed as err:
        click.echo(f"error: {err}", err=True)
        code = err.code
    except _Interrupted as err:
        log.warning("%s before the node was serving; stopping", err)
        code = EXIT_OK
    except CellactorsError as err:
        failed = store_failure(err, store.bucket or (bucket.spec if bucket else None))
        click.echo(f"error: {failed}", err=True)
        code = failed.code
    finally:
        for sock in held.values():
            sock.close()
        if node is not None:
            try:
                node.stop()
            except Exception:
                log.exception("stopping node %s failed", node_id)
        if bucket is not None:
            with contextlib.suppress(Exception):
                bucket.close()
        if embedded is not None:
            log.info("stopping the embedded store")
            embedded.stop()
    if code == EXIT_FENCED:
        log.error("node %s exits after a self-fence", node_id)
    return code


def _start_embedded(store: StoreArgs, data_dir: Path) -> tuple[Any, Bucket]:
    """Start SeaweedFS under ``data_dir/store`` and create the ``cellactors`` bucket."""
    if store.endpoint:
        raise StartupError("--endpoint needs --bucket (without --bucket the store is embedded)")
    log.warning(
        "no --bucket given: starting an embedded SeaweedFS store under %s. This is a "
        "single-machine default for trying cellactors out, NOT a fleet: other machines cannot "
        "share it and its durability is this one disk. Give --bucket s3://... or gs://... "
        "to run a fleet.",
        data_dir / "store",
    )
    private_dir(data_dir)  # the store's files, the fleet key among them, are this user's
    return start_embedded_store(data_dir / "store", store)


def _probe(bucket: Bucket) -> None:
    """Run the sequential conditional-write contract under ``probe/``; refuse a store
    that does not keep it."""
    from cellactors.errors import StoreCredentialsError, StoreUnreachable
    from cellactors.persistence.store.qualify import run_contract

    report = run_contract(bucket)
    if isinstance(report.cause, StoreCredentialsError | StoreUnreachable):
        raise report.cause  # the store was never asked: not a verdict on its contract
    if report.ok:
        log.info("store probe on %s: %s", bucket.spec, report.summary())
        return
    log.error("store probe on %s failed: %s", bucket.spec, report.summary())
    raise StartupError(
        f"{bucket.spec} failed the conditional-write probe ({report.summary()}); "
        "this store cannot fence a fleet. Run `cellactors qualify` for details."
    )
