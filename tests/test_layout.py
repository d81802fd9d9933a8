"""The architecture's rules, checked: folders are import paths, dependency direction, no import circles, light
imports, short module docstrings, and the README's promises."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
#: Each part's folder is a source root of the ``jaxcache`` namespace, and its own distribution.
PARTS = ("core", "client", "warmup", "service")
#: What each part may import besides itself.
ALLOWED = {"core": set(), "client": {"core"}, "warmup": {"core", "client"}, "service": {"core"}}
MAX_DOCSTRING_LINES = 12


def _ours(path: Path) -> bool:
    # Not what builds and editable installs leave beside the sources.
    return not any(p == "__pycache__" or p == "build" or p.endswith(".egg-info") for p in path.parts)


def sources(part: str) -> list[Path]:
    return sorted(p for p in (ROOT / part).rglob("*.py") if _ours(p.relative_to(ROOT)))


def module_name(part: str, path: Path) -> str:
    rel = path.relative_to(ROOT / part).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


ALL = {module_name(part, p): (part, p) for part in PARTS for p in sources(part)}


def part_of(module: str) -> str | None:
    """The part that holds ``module`` (``jaxcache.client.x`` is the client's), or None outside jaxcache."""
    if module != "jaxcache" and not module.startswith("jaxcache."):
        return None
    second = module.split(".")[1] if "." in module else ""
    return second if second in ("client", "warmup", "service") else "core"


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (functions too); ``from m import x`` is ``m.x`` when that is
    a module, else ``m``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                names.add(sub if sub in ALL else node.module)
    return names


@pytest.mark.parametrize("part", PARTS)
def test_every_folder_is_its_import_path(part):
    """A module's path under its part's folder is its import path: no package-dir maps, no finder magic."""
    project = tomllib.loads((ROOT / part / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-dir"] == {"": "."}, f"{part}/ must be a plain source root"
    assert not (ROOT / part / "jaxcache" / "__init__.py").exists(), "jaxcache is a namespace: no __init__.py"
    for path in sources(part):
        rel = path.relative_to(ROOT / part)
        assert rel.parts[0] == "jaxcache", f"{part}/{rel}: sources live under {part}/jaxcache/"
        owner = part_of(module_name(part, path))
        assert owner == part, f"{part}/{rel} is a module of the {owner} part: move it to {owner}/"


@pytest.mark.parametrize("name", sorted(ALL), ids=str)
def test_dependency_direction(name):
    part, path = ALL[name]
    for imported in imports(path):
        other = part_of(imported)
        assert other is None or other == part or other in ALLOWED[part], (
            f"{name} imports {imported}: the {part} part may import only {sorted(ALLOWED[part]) or 'itself'}"
        )


#: The service's layers, top to bottom: a module imports its own layer's and lower ones', never a higher one's. An
#: entry names a top-level module or folder, or one module of a folder (``reports.ingest``), and the longest entry that
#: names a module decides its layer (modules named nowhere here, such as settings and auth, are below them all). The
#: feature folders import no other feature (test_a_feature_imports_no_other_feature): the composers put them together.
SERVICE_LAYERS = (
    ("app", "server", "command", "demo"),
    ("dashboard", "rounds"),
    ("caches", "entries", "prune", "rescan", "integrity", "warmups", "reports", "ops"),
    ("web",),
    ("state",),
    ("background", "metrics", "memory"),
    ("catalog",),
)


def service_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["jaxcache", "service"] or len(parts) < 3:
        return None
    name = ".".join(parts[2:])
    named = [(len(entry), i) for i, names in enumerate(SERVICE_LAYERS) for entry in names
             if name == entry or name.startswith(entry + ".")]
    return max(named)[1] if named else len(SERVICE_LAYERS)


@pytest.mark.parametrize("name", sorted(n for n, (part, _) in ALL.items() if part == "service"), ids=str)
def test_the_service_imports_only_downwards(name):
    """app -> dashboard, rounds -> the features -> web -> state -> the loops, metrics, memory -> catalog:
    nothing reaches back up."""
    mine = service_layer(name)
    for imported in imports(ALL[name][1]):
        theirs = service_layer(imported)
        assert mine is None or theirs is None or theirs >= mine, (
            f"{name} imports {imported}, a layer above it: {SERVICE_LAYERS}")


def _no_circle(graph: dict[str, set[str]], what: str) -> None:
    done: set[str] = set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            cycle = stack[stack.index(node):] + [node]
            raise AssertionError(f"{what} circle: " + " -> ".join(cycle))
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, stack)
        stack.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name, [])


def test_no_import_circles():
    graph = {name: {i for i in imports(path) if i in ALL and i != name} for name, (_, path) in ALL.items()}
    _no_circle(graph, "import")


#: What every feature of the service may import besides the core: these folders and the top-level modules (state,
#: settings, metrics, memory, auth, background). The composers put features together: only they import features.
SERVICE_SHARED = ("catalog", "web")
SERVICE_COMPOSERS = ("app", "dashboard", "rounds")
SERVICE_FEATURES = tuple(sorted(
    p.name for p in (ROOT / "service" / "jaxcache" / "service").iterdir()
    if (p / "__init__.py").is_file() and p.name not in SERVICE_SHARED + SERVICE_COMPOSERS))


def service_unit(module: str) -> str | None:
    """The service's top-level module or folder that holds ``module`` (``reports`` for reports.ingest.queue)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["jaxcache", "service"] and len(parts) > 2 else None


def _service_units() -> dict[str, dict[str, set[str]]]:
    """``{unit: {unit it imports: {importing module}}}`` over the service's top-level modules and folders."""
    graph: dict[str, dict[str, set[str]]] = {}
    for name, (part, path) in ALL.items():
        if part == "service" and (unit := service_unit(name)) is not None:
            for other in {service_unit(i) for i in imports(path)} - {None, unit}:
                graph.setdefault(unit, {}).setdefault(other, set()).add(name)
    return graph


def test_no_import_circles_between_the_service_folders():
    """Between folders too: modules of several folders can make a circle without any module importing itself."""
    _no_circle({unit: set(imported) for unit, imported in _service_units().items()}, "folder import")


@pytest.mark.parametrize("feature", SERVICE_FEATURES)
def test_a_feature_imports_no_other_feature(feature):
    """A feature folder imports only the shared layers and the core; what needs another feature is handed it where
    the app is assembled (app.py), as the loops are handed their passes."""
    assert set(SERVICE_FEATURES) >= {"caches", "entries", "integrity", "prune", "reports", "rescan", "warmups"}
    crossing = {other: sorted(modules) for other, modules in _service_units().get(feature, {}).items()
                if other in SERVICE_FEATURES}
    assert not crossing, f"{feature} imports other features: {crossing} (hand it what it needs: app.py)"


def _private_uses(path: Path) -> list[str]:
    """Private names (``_x``) of other jaxcache modules that ``path`` imports or reads off a module it imported."""
    tree = ast.parse(path.read_text())
    modules: dict[str, str] = {}  # local name -> jaxcache module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and part_of(node.module):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in ALL:
                    modules[a.asname or a.name] = sub
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if part_of(a.name) and a.asname:
                    modules[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return sorted(set(found))


@pytest.mark.parametrize("name", sorted(ALL))
def test_no_module_uses_anothers_private_names(name):
    """A name with a leading underscore is its module's own: another module that needs it asks for a public one."""
    assert _private_uses(ALL[name][1]) == []


def _code_files() -> list[Path]:
    files = [p for part in PARTS for p in sources(part)]
    return files + sorted((ROOT / "bench").glob("*.py")) + sorted(p for p in (ROOT / "tests").rglob("*.py") if _ours(p))


@pytest.mark.parametrize("path", _code_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_docstrings_are_short(path):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    assert len(doc.splitlines()) <= MAX_DOCSTRING_LINES, "module docstring: say why in a few lines (docs/ for more)"


def test_code_cites_only_what_the_repository_holds():
    outside = "DESIGN" + ".md"  # the team's document beside the checkout, which the project must not need
    for path in _code_files():
        text = path.read_text()
        assert outside not in text, f"{path.relative_to(ROOT)}: cite docs/ in this repository"
        for doc in re.findall(r"docs/[\w./-]+\.md", text):
            assert (ROOT / doc).is_file(), f"{path.relative_to(ROOT)} cites {doc}, which does not exist"


def test_ruff_knows_jaxcache_is_first_party():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert config["lint"]["isort"]["known-first-party"] == ["jaxcache"]
    assert set(PARTS) <= set(config["src"])


def _loaded_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


HEAVY = {"fastapi", "sqlalchemy", "uvicorn", "starlette", "jax", "jaxlib", "pydantic"}


@pytest.mark.parametrize(
    "stmt",
    [
        "import jaxcache.entry, jaxcache.scan, jaxcache.storage, jaxcache.stats, jaxcache.doctor, jaxcache.records",
        "import jaxcache.client",
        "from jaxcache.storage import open_storage; open_storage('.')",
        "import jaxcache.cli",
    ],
)
def test_core_and_client_stay_light(stmt):
    loaded = _loaded_after(stmt)
    heavy = {m for m in loaded if m.split(".")[0] in HEAVY}
    heavy |= {m for m in loaded if m.startswith("google.cloud")}
    if stmt == "import jaxcache.client":
        heavy = {m for m in heavy if m.split(".")[0] not in ("jax", "jaxlib")}  # the client configures JAX
    assert not heavy, f"{stmt!r} pulled in {sorted(heavy)[:5]}"


def test_the_service_never_loads_jax():
    loaded = _loaded_after("import jaxcache.service.app, jaxcache.service.command")
    assert not {m for m in loaded if m.split(".")[0] in ("jax", "jaxlib")}


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
    for folder in ("core/", "client/", "service/", "warmup/", "deploy/", "tests/", "bench/", "docs/"):
        assert folder in readme, folder


def test_every_service_setting_is_documented():
    from jaxcache.service.settings import ServiceSettings

    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    for name in ServiceSettings.model_fields:
        assert f"`JAXCACHE_{name.upper()}`" in guide, f"document JAXCACHE_{name.upper()} in docs/operator-guide.md"


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines: reference material goes to docs/ (at most 250)"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings (not of `#` lines inside code blocks)."""
    anchors, inside = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif not inside and (heading := re.match(r"#{1,6} (.+)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-"))
    return anchors


PAGES = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")))]


@pytest.mark.parametrize("page", PAGES)
def test_every_link_between_the_pages_resolves(page):
    """Each relative link of the README and docs/ names a file that exists, and a heading of it where it names one."""
    text = (ROOT / page).read_text()
    broken = []
    for target in re.findall(r"\]\(([^()\s]+)\)", re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (ROOT / page).parent / path if path else ROOT / page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, f"{page} links to what is not there: {broken}"


RECORD_TYPES = {"RunRecord": "records", "KeyUsage": "records", "Fingerprint": "records", "WarmupRecord": "coverage",
                "ProgramCoverage": "coverage"}


def test_each_record_format_is_defined_once():
    """The run and coverage records have one schema each (jaxcache.records, jaxcache.coverage): no second parser or
    model of them anywhere, the API's included."""
    for name, (_, path) in ALL.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for record, home in RECORD_TYPES.items():
                    if record in node.name:
                        assert name == f"jaxcache.{home}", f"{name} defines {node.name}: use jaxcache.{home}.{record}"


def test_the_documented_imports_work():
    code = ("from jaxcache import client; from jaxcache.client import enable_cache; "
            "assert client.enable_cache is enable_cache; import jaxcache.warmup, jaxcache.service")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
