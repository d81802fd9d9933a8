"""The architecture's rules, checked: dependency direction, light imports, the README's promises."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
CORE = ROOT / "core"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


# The CLI (core/cli.py) is the composition root: it alone may wire the parts together.
@pytest.mark.parametrize(
    "path", sorted(p for p in CORE.rglob("*.py") if p.name != "cli.py"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_core_imports_no_part(path):
    parts = {"jaxcache.client", "jaxcache.service", "jaxcache.warmup"}
    bad = {n for n in _imports(path) if any(n == p or n.startswith(p + ".") for p in parts)}
    assert not bad, f"{path.name} imports {bad}: the core must not depend on client, service or warm-up"


@pytest.mark.parametrize("path", sorted((ROOT / "service").rglob("*.py")), ids=lambda p: p.name)
def test_service_never_imports_client_or_warmup(path):
    bad = {n for n in _imports(path) if n.startswith(("jaxcache.client", "jaxcache.warmup"))}
    assert not bad


def _loaded_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "stmt",
    [
        "import jaxcache.entry, jaxcache.scan, jaxcache.storage, jaxcache.stats, jaxcache.doctor",
        "import jaxcache.client",
        "from jaxcache.storage import open_storage; open_storage('.')",
    ],
)
def test_core_and_client_stay_light(stmt):
    loaded = _loaded_after(stmt)
    heavy = {m for m in loaded if m.split(".")[0] in {"fastapi", "sqlalchemy", "uvicorn", "starlette", "jax"}}
    heavy |= {m for m in loaded if m.startswith("google.cloud")}
    if stmt == "import jaxcache.client":
        heavy.discard("jax")  # the client configures JAX; it is its one heavy import
        heavy = {m for m in heavy if not m.startswith("jax")}
    assert not heavy, f"{stmt!r} pulled in {sorted(heavy)[:5]}"


def test_gcs_backend_loads_google_cloud_storage_only_for_gs():
    assert "google.cloud.storage" in _loaded_after("import jaxcache.storage.gcs")


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make run" in readme
    assert re.search(r"^make test\b", ci, re.M)


def test_readme_explains_the_layout():
    readme = (ROOT / "README.md").read_text()
    assert "## Layout" in readme
    for folder in ("core/", "client/", "service/", "warmup/", "deploy/", "tests/", "bench/"):
        assert folder in readme, folder


def test_every_service_setting_is_documented():
    from jaxcache.service.settings import ServiceSettings

    readme = (ROOT / "README.md").read_text()
    for name in ServiceSettings.model_fields:
        assert f"`JAXCACHE_{name.upper()}`" in readme, f"JAXCACHE_{name.upper()} is not documented in README.md"
