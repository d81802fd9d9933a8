"""``make run``'s demo, said in ``make run``'s terms: an admin token, so that a prune previewed on its dashboard can
be applied (``DIR/admin-token`` and its hash in ``DIR/tokens``, for ``--tokens-file``, made once), and whether the
port it is about to serve on is free (``make run PORT=...``, not ``serve``'s ``--port``, chooses another)."""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
from pathlib import Path

from jaxcache.errors import InvalidInputError


def make(directory: Path) -> tuple[Path, Path]:
    """``(admin-token, tokens)`` in ``directory``; an existing token is kept, so a signed-in browser stays signed in."""
    directory.mkdir(parents=True, exist_ok=True)
    token_path, tokens_path = directory / "admin-token", directory / "tokens"
    if not token_path.is_file():
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    token = token_path.read_text().strip()
    tokens_path.write_text(f"{hashlib.sha256(token.encode()).hexdigest()} admin  # the demo's, from admin-token\n")
    return token_path, tokens_path


def token_note(token_path: Path, tokens_path: Path, tokens_file: str | None) -> str | None:
    """What to say of the admin token, by the JAXCACHE_TOKENS_FILE this ``make run`` serves with: how to serve with
    the demo's, or, when that is what it does, how to sign in with it; nothing when it serves with other tokens."""
    if not tokens_file:
        return (f"reads are open on loopback. To apply prunes from the dashboard, serve with the admin token made for"
                f" this demo: JAXCACHE_TOKENS_FILE={tokens_path} make run, then sign in (/login) with the token in"
                f" {token_path}")
    if Path(tokens_file).resolve() == tokens_path.resolve():
        return (f"serving with the admin token made for this demo (JAXCACHE_TOKENS_FILE): to apply prunes from the"
                f" dashboard, sign in (/login) with the token in {token_path}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxcache.service.demo", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to write admin-token and tokens (make run: demo-catalog/)")
    parser.add_argument("--host", help="the address make run serves on (HOST): checked free with --port")
    parser.add_argument("--port", type=int, help="the port make run serves on (PORT): checked free")
    args = parser.parse_args(argv)
    if args.port is not None:
        from jaxcache.service.server import listen

        try:  # the bind serve makes, said with make run's variable rather than serve's --port
            listen(args.host or "127.0.0.1", args.port,
                   elsewhere=f"make run PORT={9000 if args.port != 9000 else 9001}, or PORT=0 for any free one").close()
        except InvalidInputError as exc:
            print(f"jaxcache demo: error: {exc}", file=sys.stderr)
            return 1
    token_path, tokens_path = make(args.directory)
    note = token_note(token_path, tokens_path, os.environ.get("JAXCACHE_TOKENS_FILE"))
    if note is not None:
        print(f"jaxcache demo: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
