"""Every command: ``-h``, the shared store options, and failures that end with one
``error:`` line and a documented exit code. Missing credentials (4), an unreachable endpoint
(5) and a store that breaks the conditional-write contract are told apart, each under real
conditions; only the last says the store cannot fence."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from cellactors.cli import main
from cellactors.cli.failures import EXIT_ADDRESS_IN_USE, EXIT_CREDENTIALS, EXIT_UNREACHABLE
from cellactors.persistence.store.embedded import SeaweedServer, free_port
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.fleet import COUNTER_APP
from tests.helpers.s3_fake import FakeS3, running_fake

COMMANDS = ["serve", "qualify", "restore", "status", "dev"]
STORE_COMMANDS = ["serve", "qualify", "restore", "status"]
STORE_FLAGS = {
    "--bucket": "CELLACTORS_BUCKET",
    "--endpoint": "CELLACTORS_ENDPOINT",
    "--region": "CELLACTORS_REGION",
    "--access-key-id": "CELLACTORS_S3_ACCESS_KEY_ID",
    "--secret-access-key": "CELLACTORS_S3_SECRET_ACCESS_KEY",
}


def cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 90.0
) -> subprocess.CompletedProcess[str]:
    """``cellactors ARGS`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "cellactors.cli", *args],
        cwd=cwd,
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def no_credentials_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose AWS credential chain finds nothing: AWS_* unset, a credentials
    file and a config file that do not exist, a fresh HOME, no instance metadata."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CELLACTORS_"))}
    env.update(
        HOME=str(tmp_path),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "bogus-credentials"),
        AWS_CONFIG_FILE=str(tmp_path / "bogus-config"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def command_args(command: str, tmp_path: Path) -> list[str]:
    """What each store command needs besides the store options."""
    if command == "serve":
        return [
            "serve",
            "--app",
            str(COUNTER_APP),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--internal-listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(tmp_path / "data"),
        ]
    if command == "restore":
        return ["restore", "--cell", "Counter:a", "--output", str(tmp_path / "out.db")]
    return [command]


@pytest.fixture
def fake() -> Iterator[FakeS3]:
    server = FakeS3("enforce").start()
    server.create_bucket("fleet")
    yield server
    server.stop()


# --------------------------------------------------------------------------- help and options


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_dash_h_works_everywhere(command: str, tmp_path: Path) -> None:
    res = cli([command, "-h"] if command else ["-h"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: cellactors")
    assert "-h, --help" in res.stdout


def test_cellactors_alone_prints_its_help_and_exits_0(tmp_path: Path) -> None:
    res = cli([], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: cellactors")
    assert all(command in res.stdout for command in COMMANDS)
    assert "error:" not in res.stderr


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_store_options_are_the_same_everywhere(command: str) -> None:
    cmd = main.commands[command]
    options = {p.opts[0]: p for p in cmd.params if isinstance(p, click.Option)}
    for flag, envvar in STORE_FLAGS.items():
        assert flag in options, f"{command} lacks {flag}"
        assert options[flag].envvar == envvar, f"{command} {flag}"


def test_usage_errors_end_with_one_error_line(tmp_path: Path) -> None:
    res = cli(["status"], tmp_path, env=no_credentials_env(tmp_path))
    assert res.returncode == 2
    assert last_line(res.stderr).startswith("error: Missing option '--bucket'")
    assert sum(line.startswith("error:") for line in res.stderr.splitlines()) == 1
    res = cli(["nosuchcommand"], tmp_path)
    assert res.returncode == 2 and last_line(res.stderr).startswith("error: No such command")


# --------------------------------------------------------------------------- store failures


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_missing_credentials(command: str, tmp_path: Path, fake: FakeS3) -> None:
    args = [*command_args(command, tmp_path), "--bucket", "s3://fleet"]
    res = cli([*args, "--endpoint", fake.endpoint], tmp_path, env=no_credentials_env(tmp_path))
    assert res.returncode == EXIT_CREDENTIALS, res.stderr
    line = last_line(res.stderr)
    assert line.startswith("error: no usable credentials for s3://fleet")
    assert "cannot fence" not in res.stderr and "Traceback" not in res.stderr
    assert fake.requests == [], "a request went out without credentials"


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_unreachable_endpoint(command: str, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    args = [*command_args(command, tmp_path), "--bucket", "s3://fleet", "--endpoint", closed]
    res = cli([*args, "--access-key-id", "k", "--secret-access-key", "s"], tmp_path)
    assert res.returncode == EXIT_UNREACHABLE, res.stderr
    line = last_line(res.stderr)
    assert line.startswith("error: cannot reach the store for s3://fleet") and closed in line
    assert "cannot fence" not in res.stderr and "Traceback" not in res.stderr


def test_a_store_that_ignores_conditions_cannot_fence(tmp_path: Path) -> None:
    with running_fake("ignore") as lax:
        lax.create_bucket("lax")
        store = ["--bucket", "s3://lax", "--endpoint", lax.endpoint]
        res = cli([*command_args("serve", tmp_path), *store], tmp_path)
        assert res.returncode == 2, res.stderr
        assert "cannot fence a fleet" in last_line(res.stderr)
        assert not any(k.startswith(("nodes/", "fleet/")) for k in lax.objects("lax"))
        res = cli(["qualify", *store, "--rounds", "1", "--writers", "2"], tmp_path)
        assert res.returncode == 1, res.stdout
        assert "cannot fence" in last_line(res.stdout)


# --------------------------------------------------------------------------- serve


def test_serve_fails_at_once_on_a_port_in_use(
    tmp_path: Path, seaweed: SeaweedServer, sw_bucket: S3Bucket
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli(
            [
                "serve",
                "--app",
                str(COUNTER_APP),
                "--bucket",
                f"s3://{sw_bucket.bucket}",
                "--endpoint",
                seaweed.endpoint,
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--internal-listen",
                f"127.0.0.1:{port}",
                "--data-dir",
                str(tmp_path / "data"),
            ],
            tmp_path,
        )
    assert res.returncode == EXIT_ADDRESS_IN_USE, res.stderr
    line = last_line(res.stderr)
    assert line.startswith(f"error: --internal-listen 127.0.0.1:{port}: cannot listen there")
    assert "in use" in line
    assert list(sw_bucket.list("")) == [], "serve wrote to the bucket before failing"


def test_json_log_format(tmp_path: Path, fake: FakeS3) -> None:
    """Every log record is one JSON object on one line; the error line stays plain."""
    res = cli(
        [
            *command_args("serve", tmp_path),
            "--bucket",
            "s3://nosuchbucket",
            "--endpoint",
            fake.endpoint,
            "--access-key-id",
            "k",
            "--secret-access-key",
            "s",
            "--log-format",
            "json",
        ],
        tmp_path,
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert lines[-1].startswith("error: ")
    records = [json.loads(line) for line in lines[:-1]]
    assert records, res.stderr
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
    assert any(r["level"] == "ERROR" and "probe" in r["message"] for r in records)


def test_json_formatter_carries_the_exception() -> None:
    import logging

    from cellactors.cli.log_format import JsonFormatter

    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info()
        )
    text = JsonFormatter().format(record)
    assert "\n" not in text
    entry = json.loads(text)
    assert entry["message"] == "failed x" and entry["level"] == "ERROR" and entry["logger"] == "t"
    assert "ValueError: boom" in entry["exception"] and entry["time"].endswith("Z")


def test_the_exit_codes_of_a_run_are_the_commands_own() -> None:
    """``serve`` exits with how its run ended: the runner's ends are the CLI's codes."""
    from cellactors.cli import failures
    from cellactors.server.runner import RunEnd

    assert (RunEnd.OK, RunEnd.ERROR, RunEnd.FENCED) == (
        failures.EXIT_OK,
        failures.EXIT_FAILURE,
        failures.EXIT_FENCED,
    )


def test_a_secret_key_given_as_a_flag_is_warned_about_and_the_variable_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A flag shows in the process list; the environment variable does not. (The store is
    unreachable, so the command ends with exit 5 either way.)"""
    from click.testing import CliRunner

    args = [
        "restore",
        "--bucket",
        "s3://some-bucket",
        "--endpoint",
        f"http://127.0.0.1:{free_port()}",
        "--access-key-id",
        "k",
        "--cell",
        "Counter:a",
        "--output",
        str(tmp_path / "o.db"),
    ]
    runner = CliRunner()
    caplog.set_level(logging.WARNING, logger="cellactors.cli")
    flagged = runner.invoke(main, [*args, "--secret-access-key", "s3cr3t"])
    assert "visible to every user" in caplog.text
    assert "s3cr3t" not in caplog.text + flagged.output
    caplog.clear()
    quiet = runner.invoke(main, args, env={"CELLACTORS_S3_SECRET_ACCESS_KEY": "s3cr3t"})
    assert "visible to every user" not in caplog.text
    assert flagged.exit_code == quiet.exit_code == EXIT_UNREACHABLE


def test_the_secret_key_can_come_from_a_file_and_only_once(tmp_path: Path) -> None:
    """A mounted file keeps the key out of argv and the environment."""
    from click.testing import CliRunner

    from cellactors.cli.store_options import StoreArgs, store_options

    @click.command()
    @store_options()
    def show(store: StoreArgs) -> None:
        click.echo(f"secret={store.secret_access_key} argv={store.secret_in_argv}")

    secret = tmp_path / "secret"
    secret.write_text("from-the-file\n")
    runner = CliRunner()
    base = ["--bucket", "s3://some-bucket"]
    got = runner.invoke(show, [*base, "--secret-access-key-file", str(secret)])
    assert got.exit_code == 0 and "secret=from-the-file argv=False" in got.output
    via_env = runner.invoke(show, base, env={"CELLACTORS_S3_SECRET_ACCESS_KEY_FILE": str(secret)})
    assert "secret=from-the-file" in via_env.output
    both = runner.invoke(
        show, [*base, "--secret-access-key", "x", "--secret-access-key-file", str(secret)]
    )
    assert both.exit_code == 2 and "once" in both.output
    (tmp_path / "empty").write_text("")
    empty = runner.invoke(show, [*base, "--secret-access-key-file", str(tmp_path / "empty")])
    assert empty.exit_code == 2 and "empty" in empty.output
    missing = runner.invoke(show, [*base, "--secret-access-key-file", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
