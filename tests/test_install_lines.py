"""Every install line the README, the guides and the images give resolves (#73 item 1): each names parts and extras
that exist, and together they resolve against the package index as it is today, so that an upstream release that
breaks one (a new aiobotocore pinning a botocore no boto3 has, a JAX whose extras change) fails here, not in a
user's fresh venv. How, in one pip call of every line's requirements at once, and why so: the comment below.
"""

# One `pip install --dry-run --report` of every line's requirements at once, with this venv's pip (the current one:
# `make` upgrades it), run as `python -m pip`. The parts' own requirements are read from their pyproject.toml files
# and given to pip flattened (a part named by another, `jaxcache[s3]==0.1.0`, replaced by that part's requirements),
# so pip builds nothing: building the four parts' metadata in isolated environments cost more than resolving. One
# call for every line: any one line's requirements are a subset of all of them, so a solution of the whole satisfies
# each line, and one resolution shares its index pages and metadata. Measured on the 2-core machine, busy: 29 s for
# the one call (50-59 s without fast-deps, below), against 6-99 s for each line's own `--dry-run` with pip 23.2 and
# its builds, 7.4 min for all of them. What it cannot show is the time pip 23.2 (the one a Python 3.11 venv brings)
# takes to find the solution: that is a property of its backtracking, kept short by the order the client's s3 extra
# states (client/pyproject.toml) and measured by hand for the issue. A lock file kept here was the alternative: free
# to check, but it protects only installs that use it, and it would pin every dependency of a library whose extras
# are ranges on purpose.

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "deploy" / "README.md",
         *sorted((REPO / "deploy" / "docker").glob("*.Dockerfile"))]
_INSTALL = re.compile(r"pip install ([^`#\n]*)")


@cache
def _project(folder: str) -> dict:
    return tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]


@cache
def _folders() -> dict[str, str]:
    """Each part's distribution name, canonical, and its folder."""
    folders = [p.parent.name for p in REPO.glob("*/pyproject.toml")]
    return {canonicalize_name(_project(f)["name"]): f for f in folders}


def install_lines() -> dict[str, list[str]]:
    """Every `pip install` line of the pages, as where it is written and the arguments it gives (options left
    out: --no-cache-dir and the like change nothing a resolution sees)."""
    found = {}
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for match in _INSTALL.finditer(line):
                words = shlex.split(match[1].split(" into ")[0])
                found[f"{page.relative_to(REPO)}:{n}"] = [w for w in words if not w.startswith("-")]
    return found


def requirements(word: str) -> list[str]:
    """What pip installs for one argument of a line: a part's folder with its extras (`./core[s3]`), flattened
    through the parts it names, or a requirement as written (`jax[tpu]==0.10.2`)."""
    if not word.startswith("./"):
        return [word]
    folder, _, extras = word.removeprefix("./").partition("[")
    project = _project(folder)
    wanted = [e for e in extras.rstrip("]").split(",") if e]
    texts = list(project.get("dependencies", []))
    for extra in wanted:
        assert extra in project.get("optional-dependencies", {}), f"{word}: {project['name']} has no extra {extra!r}"
        texts += project["optional-dependencies"][extra]
    out = []
    for text in texts:
        req = Requirement(text)
        part = _folders().get(canonicalize_name(req.name))
        if part is None:
            out.append(text)
        else:  # a part, installed from its folder in the same call: what it requires instead
            out += requirements(f"./{part}[{','.join(sorted(req.extras))}]")
    return out


def test_every_install_line_names_parts_and_extras_that_exist():
    lines = install_lines()
    assert len(lines) >= 10, lines
    for where, words in lines.items():
        assert words, where
        for word in words:
            if word.startswith("./"):
                assert (REPO / word.removeprefix("./").partition("[")[0] / "pyproject.toml").is_file(), (where, word)
            requirements(word)  # an extra the part lacks fails here, naming it


def _index_reachable() -> bool:
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "pip"], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode == 0


def test_every_install_line_resolves_against_the_index(tmp_path):
    if not _index_reachable():
        pytest.skip("the package index cannot be reached from here (pip index versions pip failed)")
    wanted = sorted({req for words in install_lines().values() for word in words for req in requirements(word)})
    listed = tmp_path / "requirements.txt"
    listed.write_text("\n".join(wanted) + "\n")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
           "-r", str(listed)]
    # Where the index serves no metadata files of its own (PEP 658), pip would download every wheel whole to read
    # its requirements, CUDA's among them (gigabytes): fast-deps reads them with range requests. A pip that no
    # longer knows the feature resolves without it.
    proc = subprocess.run([*pip, "--use-feature=fast-deps"], capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0 and "fast-deps" in proc.stderr and "invalid choice" in proc.stderr:
        proc = subprocess.run(pip, capture_output=True, text=True, timeout=300, env=env)
    errors = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("WARNING: Location"))
    assert proc.returncode == 0, f"the install lines do not resolve together:\n{errors[-4000:]}"
    chosen = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
              for i in json.loads(proc.stdout)["install"]}
    for name in ("jax", "boto3", "s3fs", "adlfs", "gcsfs", "libtpu", "fastapi"):
        assert name in chosen, (name, sorted(chosen))
