"""Bucket specs: ``s3://bucket[/prefix]`` or ``gs://bucket[/prefix]``, nothing else.

Parsing is strict so that a typo fails at startup with an error naming the accepted forms,
instead of silently pointing a fleet at the wrong place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cellactors.errors import ConfigError

ACCEPTED_FORMS = "s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"

_SCHEMES = ("s3", "gs")
# S3 and GCS both accept lowercase letters, digits, dots and hyphens (GCS adds underscores).
# Patterns are used with fullmatch: "$" alone would accept a trailing newline.
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_IP_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_PREFIX_CHARS = re.compile(r"[A-Za-z0-9._/-]*")
_PREFIX_CHAR = re.compile(r"[A-Za-z0-9._/-]")


@dataclass(frozen=True)
class BucketSpec:
    """A parsed bucket spec: dialect, bucket name and normalised key prefix (no slashes at
    either end, possibly empty)."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        tail = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.bucket}{tail}"

    @property
    def is_gcs(self) -> bool:
        return self.scheme == "gs"


def parse_bucket_spec(text: str) -> BucketSpec:
    """Parse and validate a bucket spec, raising :class:`ConfigError` with the reason."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"empty bucket spec; expected {ACCEPTED_FORMS}")
    raw = text.strip()
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise ConfigError(f"bucket spec {raw!r} has no scheme; expected {ACCEPTED_FORMS}")
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"bucket spec {raw!r} uses unsupported scheme {scheme!r}; expected {ACCEPTED_FORMS}"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"bucket spec {raw!r} names no bucket; expected {ACCEPTED_FORMS}")
    if not _valid_bucket_name(scheme, bucket):
        raise ConfigError(
            f"invalid bucket name {bucket!r} in {raw!r}: use 3-63 lowercase letters, digits, "
            "dots and hyphens (GCS also allows underscores, and up to 222 characters in "
            f"dot-separated parts of at most 63); expected {ACCEPTED_FORMS}"
        )
    try:
        return BucketSpec(scheme, bucket, normalise_prefix(prefix, raw))
    except ConfigError as err:
        raise ConfigError(f"{err}; expected {ACCEPTED_FORMS}") from None


def _valid_bucket_name(scheme: str, name: str) -> bool:
    """The naming rules both stores enforce, checked here so a typo fails at startup."""
    if not _BUCKET_RE.fullmatch(name) or ".." in name or _IP_RE.fullmatch(name):
        return False
    if scheme == "s3":
        return "_" not in name and len(name) <= 63
    return len(name) <= 63 or all(0 < len(part) <= 63 for part in name.split("."))


def normalise_prefix(prefix: str, context: str = "") -> str:
    """Strip and collapse slashes; reject characters outside ``[A-Za-z0-9-_./]`` and dot
    segments, which would let two spellings name one place or escape the prefix."""
    where = f" in {context!r}" if context else ""
    if not _PREFIX_CHARS.fullmatch(prefix):
        bad = sorted({c for c in prefix if not _PREFIX_CHAR.fullmatch(c)})
        raise ConfigError(
            f"prefix {prefix!r}{where} has characters outside [A-Za-z0-9-_./]: {''.join(bad)!r}"
        )
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ConfigError(f"prefix {prefix!r}{where} may not contain '.' or '..' segments")
    return "/".join(parts)
