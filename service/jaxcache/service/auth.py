"""Bearer tokens with scopes. Tokens are configured as SHA-256 hashes; comparisons are constant-time."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import HTTPException, Request

from jaxcache.service.settings import ServiceSettings

#: Which configured scopes satisfy a required scope.
_GRANTS = {"read": {"read", "admin"}, "report": {"report", "admin"}, "admin": {"admin"},
           # what a job may ask before it starts (its integrity check): its report token, or a read token
           "read or report": {"read", "report", "admin"}}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request, for the audit log."""

    who: str
    scope: str | None


class Authenticator:
    """Decides whether a request may use a route that needs ``scope``."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._tokens = settings.token_scopes()
        self._open = settings.insecure_no_auth
        # Reads may be anonymous only where nobody else can connect and nobody configured tokens.
        self._open_reads = not self._tokens and settings.listens_on_loopback()

    @property
    def configured(self) -> bool:
        """True when tokens are configured (reads then need one too)."""
        return bool(self._tokens)

    @property
    def open_reads(self) -> bool:
        """True when reads need no token (loopback with no tokens, or --insecure-no-auth)."""
        return self._open or self._open_reads

    def check(self, request: Request, scope: str) -> Principal:
        """Return the caller of an API route (``Authorization: Bearer``), or raise 401 or 403."""
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        return self.check_token(token if kind.lower() == "bearer" else None, scope)

    def check_token(self, token: str | None, scope: str) -> Principal:
        """Who holds ``token`` (None or blank: none), else 401 (no or unknown token) or 403 (scope lacking)."""
        if self._open:
            return Principal("anonymous (insecure-no-auth)", None)
        if token is None or not token.strip():
            if scope == "read" and self._open_reads:
                return Principal("anonymous (loopback)", None)
            hint = "" if self._tokens else " (this service has no tokens configured: set JAXCACHE_TOKENS)"
            raise HTTPException(401, f"this route needs a bearer token with the {scope!r} scope{hint}",
                                headers={"WWW-Authenticate": "Bearer"})
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        granted = None
        for known, known_scope in self._tokens.items():  # every entry compared: timing reveals nothing
            if hmac.compare_digest(known, digest):
                granted = known_scope
        if granted is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        if granted not in _GRANTS[scope]:
            raise HTTPException(403, f"this token has the {granted!r} scope; this route needs {scope!r}")
        return Principal(f"token:{digest[:12]}", granted)
