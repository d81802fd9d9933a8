"""What the dashboard tests share: a copy of the session's real entries plus a torn entry, an orphaned -atime file
and run records of two jobs, and the service over it through its ASGI app."""

from __future__ import annotations

import hashlib
import html.parser
import os
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jaxcache import entry as fmt
from jaxcache import records
from jaxcache.records import Fingerprint, KeyUsage, RunRecord
from jaxcache.service.app import create_app
from jaxcache.service.settings import ServiceSettings

ROOT = Path(__file__).parent.parent
DASHBOARD = ROOT / "service" / "jaxcache" / "service" / "dashboard"
READ, ADMIN, REPORT = "dash-read-token", "dash-admin-token", "dash-report-token"
H_READ, H_ADMIN = {"Authorization": f"Bearer {READ}"}, {"Authorization": f"Bearer {ADMIN}"}
DAY = 86400.0
CHROMIUM = os.environ.get("JAXCACHE_CHROMIUM", "/usr/bin/chromium")
TORN = "jit_torn-" + hashlib.sha256(b"torn").hexdigest()
ORPHAN = "jit_gone-" + hashlib.sha256(b"gone").hexdigest()
EVAL_MISS = "jit_eval_step-" + hashlib.sha256(b"eval").hexdigest()


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


TOKENS = {sha(READ): "read", sha(ADMIN): "admin", sha(REPORT): "report"}


# --- the cache: real entries, a torn one, an orphan, run records ---------------------------------------------


def _keys(manifest: dict) -> dict[str, str]:
    return {e["module"]: e["key"] for e in manifest["entries"]}


def _record(job: str, run_id: str, keys: list[KeyUsage], *, at: float, process_index: int = 0,
            process_count: int = 1, topology: str = "1x1x1") -> RunRecord:
    return RunRecord(
        job=job, run_id=run_id, process_index=process_index, process_count=process_count, host=f"node-{process_index}",
        started_at=at - 120, updated_at=at, topology=topology, final=True, keys=keys,
        fingerprint=Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", compression="zstandard"),
    )


def seed_cache(dst: Path, manifest: dict, *, now: float) -> Path:
    """Age the copied entries 10 days, add a torn entry and an orphan, and write the jobs' run records."""
    t = now - 10 * DAY
    for p in dst.iterdir():
        if p.is_file():
            if p.name.endswith("-atime"):
                p.write_bytes(fmt.encode_atime(int(t * 1e9)))
            os.utime(p, (t, t))
    keys = _keys(manifest)
    train, tiny, odd = keys["jit_train_step"], keys["jit_tiny"], keys["jit_odd-name.v2"]
    whole = (dst / f"{train}-cache").read_bytes()
    (dst / f"{TORN}-cache").write_bytes(whole[:6])  # a writer that died early in the write
    (dst / f"{ORPHAN}-atime").write_bytes(fmt.encode_atime(int(t * 1e9)))
    for name in (f"{TORN}-cache", f"{ORPHAN}-atime"):
        os.utime(dst / name, (now - 2 * DAY, now - 2 * DAY))

    def write(key: str, compile_s: float, at: float) -> KeyUsage:
        return KeyUsage(key=key, event=records.WRITE, compiles=1, writes=1, compile_s=compile_s, first_at=at,
                        last_at=at)

    def hit(key: str, n: int, at: float) -> KeyUsage:
        return KeyUsage(key=key, event=records.HIT, hits=n, retrieval_s=0.05 * n, first_at=at - 10, last_at=at)

    first = now - 3 * DAY
    runs = [
        _record("llm-pretrain", "pre-1",
                [write(k, 4.5 if k == train else 0.25, first) for k in sorted(e["key"] for e in manifest["entries"])],
                at=first),
        *(_record("llm-pretrain", "pre-2", [hit(train, 3, now - 3600), hit(tiny, 1, now - 3600)], at=now - 3600,
                  process_index=i, process_count=2, topology="1x2x1") for i in range(2)),
        _record("llm-eval", "eval-1",
                [hit(train, 2, now - 7200), hit(odd, 1, now - 7200),
                 KeyUsage(key=EVAL_MISS, event=records.COMPILED, function="jit_eval_step", compiles=1,
                          compile_s=2.5, reason="compile time below the threshold", first_at=now - 7300,
                          last_at=now - 7300)],
                at=now - 7200),
    ]
    for r in runs:
        path = dst / r.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(r.to_json())
    return dst


def listing(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_file()}


@pytest.fixture
def seeded(tmp_path, jax_caches) -> Path:
    dst = tmp_path / "cache"
    shutil.copytree(jax_caches["zstd"].root, dst)
    return seed_cache(dst, jax_caches["zstd"].manifest, now=time.time())


# --- through the ASGI app ----------------------------------------------------------------------------------------


def settings(tmp_path: Path, root: Path, **kw) -> ServiceSettings:
    kw.setdefault("tokens", TOKENS)
    return ServiceSettings(caches={"demo": str(root)}, db=f"sqlite:///{tmp_path / 'catalog.sqlite'}", rescan_s=3600,
                           **kw)


@pytest.fixture
def app_client(tmp_path, seeded):
    with TestClient(create_app(settings(tmp_path, seeded)), follow_redirects=False) as client:
        assert client.post("/v1/caches/demo/rescan", headers=H_ADMIN).status_code == 200
        yield client


class _Page(html.parser.HTMLParser):
    """What the tests check in a page: controls and their labels, asset URLs, every URL, headings."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict] = []
        self.labels: set[str] = set()
        self.assets: list[str] = []
        self.urls: list[str] = []
        self.headings: list[str] = []
        self._heading: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("input", "select", "textarea") and a.get("type") != "hidden":
            self.controls.append(a)
        if tag == "label" and a.get("for"):
            self.labels.add(a["for"])
        if tag in ("script", "link", "img") and (a.get("src") or a.get("href")):
            self.assets.append(a.get("src") or a.get("href"))
        for name in ("href", "src", "action"):
            if a.get(name):
                self.urls.append(a[name])
        if tag in ("h1", "h2", "h3"):
            self._heading = []

    def handle_data(self, data):
        if self._heading is not None:
            self._heading.append(data)

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None



class _Shown(html.parser.HTMLParser):
    """What a reader sees of a page: its text and its tooltips (not attributes that only carry values)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.parts += [v for k, v in attrs if k == "title" and v]

    def handle_data(self, data):
        self.parts.append(data)


def shown_text(page: str, sep: str = "") -> str:
    """A page's text and tooltips, joined with ``sep``."""
    reader = _Shown()
    reader.feed(page)
    return sep.join(reader.parts)

def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def _pages(keys: dict[str, str]) -> list[str]:
    return ["/", "/caches/demo", "/caches/demo/entries", "/caches/demo/entries?sort=size&order=desc&limit=5",
            f"/caches/demo/entries/{keys['jit_train_step']}", "/caches/demo/jobs", "/caches/demo/jobs/llm-eval",
            "/caches/demo/warmups", "/caches/demo/prune", "/caches/demo/prune?functions=jit_tiny&preview=1"]
