"""Free loopback ports for the servers a test starts (PostgreSQL, fake-gcs-server, `jaxcache serve`)."""

from __future__ import annotations

import random
import socket

# Below Linux's ephemeral range (32768-60999 by default): a port the kernel hands out for binding to port 0 is
# also one it may hand to any outgoing connection (a test's HTTP client, a PostgreSQL session) in the moment
# between a test picking it and its server binding it. A random pick from this range is taken only by another
# pick, which the bind check below then refuses.
_LOW, _HIGH = 20000, 32767


def free_port() -> int:
    """A loopback port nothing is bound to now, outside the range outgoing connections take theirs from."""
    for _ in range(200):
        port = random.randint(_LOW, _HIGH)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {_LOW} and {_HIGH}")
