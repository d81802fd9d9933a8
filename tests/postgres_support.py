"""A real PostgreSQL server for the tests: one for the session (a fresh database per test), or a private one for
a test that stops and restarts it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ports import free_port

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)



@dataclass
class PostgresServer:
    """A throwaway PostgreSQL cluster: trust auth on 127.0.0.1, owned by the ``postgres`` user when we are root."""

    bin: Path
    data: Path
    port: int
    as_user: list[str]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        proc = subprocess.run(
            [*self.as_user, str(self.bin / "psql"), "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True, text=True, timeout=60,
        )
        if proc.returncode != 0:
            raise AssertionError(f"psql failed: {proc.stderr}")
        return proc.stdout

    def create_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        log = self.data.parent / "log"
        proc = subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
                               str(log), "-w", "-t", "120", "start"], capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            said = log.read_text() if log.exists() else ""
            raise AssertionError(f"pg_ctl start failed:\n{proc.stdout}\n{proc.stderr}\n{said}")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: as a crash would, every connection dropped)."""
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"],
                       capture_output=True, timeout=120)


def _pg_bin() -> Path | None:
    for d in PG_BIN_DIRS:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    return None


def _as_postgres_user() -> list[str]:
    # PostgreSQL refuses to run as root: as root, it runs as the ``postgres`` user.
    if os.geteuid() != 0:
        return []
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no 'postgres' user to run the PostgreSQL server as")
    runuser = shutil.which("runuser")
    if not runuser:
        pytest.skip("running as root without runuser (util-linux): cannot start PostgreSQL as 'postgres'")
    return [runuser, "-u", "postgres", "--"]


@contextlib.contextmanager
def launch() -> Iterator[PostgresServer]:
    """A new cluster, started; removed afterwards. Its default collation is ICU's en-US where available (as on
    most managed servers), not C: the catalog must not depend on the server's collation."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                    "(apt-get install postgresql; .ci/run does it when it can)")
    as_user = _as_postgres_user()
    # Not under pytest's tmp dir: that is private to the user running the tests, and the server runs as another.
    base = Path(tempfile.mkdtemp(prefix="jaxcache-pg-"))
    if as_user:
        shutil.chown(base, "postgres")
    data = base / "data"
    init = [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
    proc = subprocess.run([*init, "--locale-provider=icu", "--icu-locale=en-US", "--locale=C.UTF-8"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:  # a build without ICU: the default collation is C then
        shutil.rmtree(data, ignore_errors=True)
        proc = subprocess.run(init, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"initdb failed:\n{proc.stdout}\n{proc.stderr}")
    server = PostgresServer(bin_dir, data, free_port(), as_user)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session, started from the installed binaries (``.ci/run`` installs Debian's
    ``postgresql`` where missing)."""
    with launch() as server:
        yield server


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of the test's own, which it may stop and start."""
    with launch() as server:
        yield server


@pytest.fixture
def pg_url(postgres) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    return postgres.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request, tmp_path) -> str:
    """A new, empty catalog database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    return request.getfixturevalue("pg_url")
