"""The console's safety rules (issue 31, item 3): where it may bind, the access token, the
CSRF check of every state-changing request, and the headers every response carries.

The token is the only secret: a login form trades it for an HttpOnly, SameSite=Strict cookie
holding an HMAC of it (never the token itself), and every form that changes state carries a
second HMAC of it (the CSRF value) that a page of another origin cannot read. A request that
changes state must bring both, and an `Origin` header, when the browser sends one, naming this
console. A console bound to a non-loopback address also asks for the cookie on every read.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from pathlib import Path

import attrs

from ...foundation.errors import UsageError

__all__ = [
    "AUTH_COOKIE",
    "CONTENT_SECURITY_POLICY",
    "Access",
    "is_loopback",
    "read_token_file",
    "security_headers",
]

AUTH_COOKIE = "subagents_auth"
# No inline script or style, nothing from elsewhere, no framing: a log text that slipped past the
# escaping still could not run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with a form's
    # POST, and the origin check could no longer tell this console's forms from another page's.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)


def security_headers() -> list[tuple[bytes, bytes]]:
    return list(_HEADERS)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def read_token_file(path: str) -> str:
    """The token a file holds (its first line, stripped): a usage error when it cannot be read,
    is empty or is too short to guess at."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--token-file {path}: cannot be read ({exc.__class__.__name__})") from None
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if len(token) < 16:
        raise UsageError(f"--token-file {path}: the token must be at least 16 characters on its first line")
    return token


@attrs.frozen
class Access:
    """The token of one console and what is derived from it."""

    token: str

    @classmethod
    def generate(cls) -> Access:
        return cls(secrets.token_urlsafe(24))

    def _mac(self, purpose: str) -> str:
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def cookie_value(self) -> str:
        return self._mac("auth-cookie")

    @property
    def csrf_value(self) -> str:
        return self._mac("csrf-form")

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.token.encode())

    def cookie_matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.cookie_value.encode())

    def csrf_matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf_value.encode())
