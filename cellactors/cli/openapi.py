"""``cellactors openapi``: print the OpenAPI document of an application offline, as a node
serving it answers ``GET /openapi.json`` (no store, no node)."""

from __future__ import annotations

import json

import click

from cellactors.cli.app_loader import load_app
from cellactors.cli.serve_options import app_option
from cellactors.server.openapi import build_openapi


@click.command("openapi")
@app_option()
@click.option(
    "--bearer",
    is_flag=True,
    help="include the bearer security scheme (a node with authentication configured)",
)
def openapi(app: str, bearer: bool) -> None:
    """Print the OpenAPI 3.1 document of APP's cell classes as JSON."""
    classes = {cls.__name__: cls for cls in load_app(app)}
    click.echo(json.dumps(build_openapi(classes, authenticated=bearer), indent=2))
