"""Bearer tokens of the collector: a file of hashed tokens, checked per request, reloaded when it
changes (docs/collector.md §5).

File format, one token per line (``#`` starts a comment, blank lines are ignored)::

    # id          hash                                                                     expires
    phone-fleet-a sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    browser-2026  sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752 2027-01-01T00:00:00Z

A token is a high-entropy random string (:func:`new_token`, 256 bits), so one SHA-256 of it is
the right hash: there is nothing to brute-force that a slow hash would protect. The file never
holds a token, and nothing here logs a token or a hash — only the token's id.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aggregator.errors import RequestRefused
from ingest.errors import TokenFileError
from ingest.files import check_private_file

__all__ = ["TokenFileError", "TokenInfo", "TokenStore", "hash_token", "mint_token",
           "new_token", "parse_expiry", "read_token_file"]

log = logging.getLogger(__name__)

#: What a token id may contain (it is logged and used as a metric-free scope of the keys).
TOKEN_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_HASH_RE = re.compile(r"sha256:([0-9a-f]{64})")
#: Longest presented token considered (anything longer is refused unhashed).
MAX_TOKEN_CHARS = 512


@dataclass(frozen=True)
class TokenInfo:
    """One line of the token file: ``id``, the SHA-256 ``digest`` (32 bytes) of the token and
    its expiry (Unix seconds, UTC) or None."""

    id: str
    digest: bytes
    expires: int | None

    def __repr__(self) -> str:  # never the hash
        return f"TokenInfo(id={self.id!r}, expires={self.expires!r})"


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> bytes:
    """SHA-256 of the token's UTF-8 bytes (32 bytes)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def _check_mode(p: Path) -> os.stat_result:
    return check_private_file(p, "token file", TokenFileError)


def read_token_file(path: str | os.PathLike) -> tuple[TokenInfo, ...]:
    """Parse a token file (module docstring for the format).

    Parameters
    ----------
    path : path
        Must be a regular file with no permission bits for group or others (``mode & 0o077 == 0``).

    Returns
    -------
    tuple of TokenInfo
        In file order; may be empty (then every request is refused).

    Raises
    ------
    TokenFileError
        Missing, unreadable, not private, or a malformed line (``<file>:<line>: …``): a bad id,
        a hash that is not ``sha256:`` and 64 lowercase hex digits, a bad expiry, extra fields,
        an id or hash used twice.

    Notes
    -----
    Source: docs/collector.md §5.2 (format), §5.3 (permissions).
    """
    p = Path(path)
    _check_mode(p)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"token file {str(p)!r} cannot be read: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    out: list[TokenInfo] = []
    ids: set[str] = set()
    digests: set[bytes] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"token file {str(p)!r} line {lineno}"
        parts = line.split()
        if len(parts) not in (2, 3):
            raise TokenFileError(f"{where}: expected 'ID sha256:HEX [EXPIRES]', got {len(parts)} field(s)")
        tid, h = parts[0], parts[1]
        if not TOKEN_ID_RE.fullmatch(tid):
            raise TokenFileError(f"{where}: the id must be 1-64 characters of A-Z a-z 0-9 . _ : -")
        m = _HASH_RE.fullmatch(h)
        if m is None:
            raise TokenFileError(f"{where} (id {tid!r}): the hash must be 'sha256:' and 64 lowercase "
                                 "hex digits")
        expires = None
        if len(parts) == 3:
            try:
                expires = parse_expiry(parts[2], now=0.0, relative=False)
            except ValueError as exc:
                raise TokenFileError(f"{where} (id {tid!r}): {exc}") from None
        digest = bytes.fromhex(m.group(1))
        if tid in ids:
            raise TokenFileError(f"{where}: the id {tid!r} is used twice")
        if digest in digests:
            raise TokenFileError(f"{where} (id {tid!r}): the same token hash is listed twice")
        ids.add(tid)
        digests.add(digest)
        out.append(TokenInfo(tid, digest, expires))
    return tuple(out)


def parse_expiry(text: str, *, now: float | None = None, relative: bool = True) -> int:
    """Unix seconds of an expiry: an ISO-8601 UTC time (``2027-01-01T00:00:00Z``, a date) or,
    with ``relative``, a duration from ``now`` (``90d``, ``12h``, ``30m``).

    Raises
    ------
    ValueError
        Naming the accepted forms.
    """
    from ingest.client.event_time import parse_duration, parse_iso_utc

    if relative and re.fullmatch(r"[0-9]+[smhdw]", text):
        return int((time.time() if now is None else now) + parse_duration(text, "--expires"))
    try:
        return parse_iso_utc(text, "expiry")
    except ValueError:
        forms = "a duration like 90d or 12h, or " if relative else ""
        raise ValueError(f"the expiry must be {forms}an ISO-8601 UTC time like "
                         f"2027-01-01T00:00:00Z, got {text!r}") from None


class TokenStore:
    """The token file, loaded at start and reloaded when its mtime (or size) changes.

    Parameters
    ----------
    path : path
        The token file (docs/collector.md §5.2).
    check_every_s : float
        Seconds between two looks at the file's mtime (default 2).
    clock, wall : callables
        Monotonic seconds (for ``check_every_s``) and Unix seconds (for expiry); for tests.
    on_reload : callable (ok: bool) → None, optional
        Called after every reload attempt (the metrics count them).

    Raises
    ------
    TokenFileError
        At construction, as :func:`read_token_file`. A later reload that fails keeps the tokens
        loaded before and logs the error (one line, without tokens or hashes).

    Notes
    -----
    Source: docs/collector.md §5.4 (rotation), §5.2 (comparison).
    """

    def __init__(self, path: str | os.PathLike, *, check_every_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 on_reload: Callable[[bool], None] | None = None) -> None:
        self.path = Path(path)
        self.check_every_s = float(check_every_s)
        self._clock, self._wall, self._on_reload = clock, wall, on_reload
        self._sig = self._signature()
        self._tokens = read_token_file(self.path)
        self._checked = clock()
        self.reloads = 0
        self.last_error: str | None = None
        log.info("token file %s: %d token(s): %s", self.path, len(self._tokens),
                 ", ".join(t.id for t in self._tokens) or "none")

    def _signature(self) -> tuple | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    @property
    def tokens(self) -> tuple[TokenInfo, ...]:
        """The tokens loaded now."""
        return self._tokens

    def maybe_reload(self, force: bool = False) -> bool:
        """Reload the file if ``check_every_s`` passed and its mtime, size or inode changed.

        Returns
        -------
        bool
            Whether new tokens were loaded.
        """
        now = self._clock()
        if not force and now - self._checked < self.check_every_s:
            return False
        self._checked = now
        sig = self._signature()
        if sig == self._sig and not force:
            return False
        self._sig = sig
        try:
            tokens = read_token_file(self.path)
        except TokenFileError as exc:
            self.last_error = str(exc)
            log.error("token file not reloaded, keeping the %d token(s) loaded before: %s",
                      len(self._tokens), exc)
            if self._on_reload is not None:
                self._on_reload(False)
            return False
        self._tokens = tokens
        self.reloads += 1
        self.last_error = None
        log.info("token file %s reloaded: %d token(s): %s", self.path, len(tokens),
                 ", ".join(t.id for t in tokens) or "none")
        if self._on_reload is not None:
            self._on_reload(True)
        return True

    def authenticate(self, authorization: str | None) -> TokenInfo:
        """The token of an ``Authorization`` header value.

        Every stored hash is compared with :func:`hmac.compare_digest` (no early exit), so the
        time taken does not say which token, or how much of it, matched.

        Returns
        -------
        TokenInfo

        Raises
        ------
        aggregator.errors.RequestRefused
            401 ``missing_token`` without a header; ``invalid_token`` for another scheme than
            ``Bearer``, an unknown token, or an expired one (the reason says expired and names
            the id).
        """
        self.maybe_reload()
        if authorization is None or not authorization.strip():
            raise RequestRefused("missing_token", "send Authorization: Bearer <token>")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise RequestRefused("invalid_token", "the Authorization header must be 'Bearer <token>'")
        if len(token) > MAX_TOKEN_CHARS:
            raise RequestRefused("invalid_token", "unknown token")
        digest = hash_token(token)
        found: TokenInfo | None = None
        for info in self._tokens:  # no early exit
            if hmac.compare_digest(info.digest, digest):
                found = info
        if found is None:
            raise RequestRefused("invalid_token", "unknown token")
        if found.expires is not None and self._wall() >= found.expires:
            from ingest.client.event_time import iso_utc

            log.warning("refused the expired token %r (expired %s)", found.id, iso_utc(found.expires))
            raise RequestRefused("invalid_token",
                                 f"the token {found.id!r} expired at {iso_utc(found.expires)}")
        return found


def mint_token(path: str | os.PathLike, token_id: str, expires: int | None = None) -> str:
    """Append a new token's hash to ``path`` (created with mode 0600) and return the token.

    Parameters
    ----------
    path : path
        The token file; an existing one must be valid and private (as the collector checks it).
    token_id : str
        1-64 characters of ``A-Z a-z 0-9 . _ : -``, not in the file yet.
    expires : int or None
        Unix seconds (UTC) after which the token is refused.

    Returns
    -------
    str
        The token (:func:`new_token`): shown once; only its hash is stored.

    Raises
    ------
    TokenFileError
        Bad id, id already present, or an existing file that is malformed or not private.

    Notes
    -----
    Source: docs/collector.md §5.1.
    """
    from ingest.client.event_time import iso_utc

    if not TOKEN_ID_RE.fullmatch(token_id or ""):
        raise TokenFileError(f"--id must be 1-64 characters of A-Z a-z 0-9 . _ : -, got {token_id!r}")
    p = Path(path)
    existing = read_token_file(p) if p.exists() else ()
    if any(t.id == token_id for t in existing):
        raise TokenFileError(f"token file {str(p)!r} already has the id {token_id!r}")
    token = new_token()
    line = f"{token_id} sha256:{hash_token(token).hex()}"
    if expires is not None:
        line += f" {iso_utc(expires)}"
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise TokenFileError(f"token file {str(p)!r} cannot be written: {exc.strerror}") from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        if f.tell() > 0 and not p.read_bytes().endswith(b"\n"):
            f.write("\n")
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return token

