"""The commands the docs show work as written when pasted: the CLI is found where the docs first use it, every curl
URL survives the shell, and the user guide's synopsis names every option the CLI has (issue 52)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaxcache.cli import build_parser, plugins

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(p for p in {*ROOT.glob("*.md"), *ROOT.glob("*/*.md"), *ROOT.glob("docs/**/*.md")}
              if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))  # not .venv's, .pytest_cache's
#: What a reader needs before the first `jaxcache ...` they paste: make installs it into .venv, not onto the PATH.
CLI_NOTE = (".venv/bin/jaxcache", ". .venv/bin/activate")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _fenced(text: str) -> Iterator[tuple[int, str]]:
    """Each line inside a fenced code block, with its offset in ``text``, continuation lines (``\\``) joined."""
    inside, offset, pending, start = False, 0, "", 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            start = start if pending else offset
            body = line.rstrip("\n")
            if body.endswith("\\"):
                pending += body[:-1] + " "
            else:
                yield start, pending + body
                pending = ""
        offset += len(line)


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_the_docs_say_where_the_cli_is_before_their_first_jaxcache_command(doc):
    text = doc.read_text()
    first = next((at for at, line in _fenced(text) if re.match(r"\s*(\$ )?jaxcache \w", line)), None)
    if first is None:
        return
    for note in CLI_NOTE:
        said = text.find(note)
        assert 0 <= said < first, f"{_name(doc)}: say {note!r} before the first `jaxcache` command"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_run_prints_where_the_cli_is():
    shown = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    (note,) = [line for line in shown.splitlines() if line.startswith("echo") and "the CLI" in line]
    assert all(n in note for n in CLI_NOTE), note


def test_the_cli_the_note_names_runs():
    """`.venv/bin/jaxcache` is the console script beside the venv's interpreter, the one these tests run on."""
    cli = Path(sys.executable).parent / "jaxcache"
    assert cli.is_file(), f"{cli}: the jaxcache console script is not installed beside {sys.executable}"
    assert subprocess.run([str(cli), "--help"], capture_output=True, timeout=60).returncode == 0


def _curls(text: str) -> Iterator[str]:
    """Every curl command in ``text``: inline code spans and fenced lines."""
    yield from re.findall(r"`(curl [^`\n]*)`", text)
    for _, line in _fenced(text):
        yield from re.findall(r"(?:^|[;&|]\s*)(curl\s.*)", line.strip())


def _unquoted_urls(command: str) -> list[str]:
    """The words of a curl command that are URLs and are not quoted (the shell would cut them at ``&`` and glob
    ``?``); a ``#`` comment ends it."""
    out = []
    for word in re.findall(r"'[^']*'|\"[^\"]*\"|\S+", command):
        if word.startswith("#"):
            break
        if word[0] not in "'\"" and re.search(r"://|localhost|/v1/|[?&]", word) and word not in ("&&", "&"):
            out.append(word)
    return out


def test_every_curl_url_in_the_docs_is_quoted():
    found = {_name(doc): list(_curls(doc.read_text())) for doc in DOCS}
    assert found["README.md"], "the README's curl commands were not found: the test would check nothing"
    bad = {doc: [w for c in cmds for w in _unquoted_urls(c)] for doc, cmds in found.items()}
    assert not {doc: words for doc, words in bad.items() if words}, "quote every curl URL: 'localhost:8080/...?a=1&b=2'"


def _synopsis() -> dict[str, str]:
    """The user guide's "Using the CLI" synopsis: each command ("ls", "keys sign") and its text."""
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    block = guide.split("## Using the CLI", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    out: dict[str, str] = {}
    command = ""
    for line in filter(str.strip, block.splitlines()):
        if line.startswith("jaxcache "):
            command = " ".join(w for w in line.split()[1:3] if re.fullmatch(r"[a-z]+", w))
            out[command] = line
        else:
            out[command] += " " + line.strip()
    return out


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """Each subcommand ("ls", "keys sign") and its parser."""
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            assert isinstance(action.choices, dict)
            for name, sub in action.choices.items():
                yield " ".join((*prefix, name)), sub
                yield from _commands(sub, (*prefix, name))


def test_the_user_guide_synopsis_names_every_option():
    synopsis = _synopsis()
    parser = build_parser(plugins.load("serve"))
    missing = []
    for command, sub in _commands(parser):
        if command not in synopsis:
            continue  # a group (`keys`, `bundle`) or warm-up, which has its own section
        for action in sub._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction) and not any(
                    re.search(re.escape(o) + r"(?![\w-])", synopsis[command]) for o in action.option_strings):
                missing.append(f"{command} {'/'.join(action.option_strings)}")
    assert not missing, f"docs/user-guide.md's synopsis lacks: {missing}"
    assert {"ls", "prune", "explain", "serve", "bundle export"} <= set(synopsis)


_SHOT = '''
import os
from pathlib import Path


def test_a_dashboard_test():
    if os.environ.get("TAKE_SHOT"):
        (Path(os.environ["JAXCACHE_SCREENSHOTS"]) / "page.png").write_bytes(b"a screenshot")
'''


@pytest.mark.slow
def test_the_run_prints_the_screenshots_folder_under_xdist_too(tmp_path):
    """docs/internals/developing.md says the test run prints where the dashboard's screenshots went: true when
    xdist's workers took them (their prints never show), and only for screenshots this run took."""
    pytest.importorskip("xdist")
    (tmp_path / "test_shot.py").write_text(_SHOT)
    shots = tmp_path / "shots"
    shots.mkdir()
    path = os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "JAXCACHE_SCREENSHOTS": str(shots), "PYTHONPATH": path}

    def tests(*args: str, take: bool) -> str:
        argv = [sys.executable, "-m", "pytest", "-p", "screenshots_support", "-p", "no:cacheprovider", "-q", *args,
                "test_shot.py"]
        proc = subprocess.run(argv, cwd=tmp_path, env={**env, "TAKE_SHOT": "1" if take else ""},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    assert f"dashboard screenshots: {shots} (1 taken by this run)" in tests("-n", "1", take=True)
    assert "dashboard screenshots" not in tests("-n", "0", take=False)  # one from an earlier run is not this run's
