"""An admin token for ``make run``'s demo, so a prune previewed on its dashboard can be applied.
Writes ``DIR/admin-token`` and ``DIR/tokens`` (its hash, for ``--tokens-file``) once, and prints how to use them."""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
from pathlib import Path


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxcache.service.demo_token", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to write admin-token and tokens (make run: demo-catalog/)")
    args = parser.parse_args(argv)
    token_path, tokens_path = make(args.directory)
    print(f"jaxcache demo: reads are open on loopback. To apply prunes from the dashboard, serve with the admin token"
          f" made for this demo: JAXCACHE_TOKENS_FILE={tokens_path} make run, then sign in (/login) with the token in"
          f" {token_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
