"""A root spelled amiss (#73 item 2): a store's URL with a slash missing (`s3:/b`, `gs:b`), backslashes, no colon, a
slash too many or the scheme in capitals once became a directory here named so, which a job filled and the CLI found
empty. One rule (jaxcache.storage) refuses it in one line naming the spelling meant, in the client, the CLI and the
service alike; a directory whose name merely holds a colon is still a root. And each store's bucket help says what
its rule admits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from jaxcache.cli import main
from jaxcache.errors import InvalidRootError
from jaxcache.service.settings import ServiceSettings
from jaxcache.storage import STORES, normalise_root

# What a user types, and what they meant.
AMISS = [
    ("s3:/b-1/cache", "s3://b-1/cache"), ("s3:b-1", "s3://b-1"), ("gs:/b-1", "gs://b-1"), ("gs:b-1/p", "gs://b-1/p"),
    ("az:/c-1", "az://c-1"), ("Az:c-1/p", "az://c-1/p"), ("S3://b-1/p", "s3://b-1/p"), ("s3:\\\\b-1\\p", "s3://b-1/p"),
    ("gcs:/b-1", "gs://b-1"), ("s3:///b-1/p", "s3://b-1/p"), ("s3//b-1/p", "s3://b-1/p"), ("file:x/y", "file:///x/y"),
]
# Directories, however much they look like something else.
STILL_ROOTS = ["./data:v2", "runs/a:b", "./s3:/b-1/cache", "C:\\x"]

# The client: enable_cache(root), then JAXCACHE_DIR=root and enable_cache(), in a process of its own (it configures
# JAX); what each raised, or the directory it took.
CLIENT = """
import json, os, sys
from jaxcache.client import enable_cache
out = []
for text in json.loads(sys.argv[1]):
    for how in ("argument", "JAXCACHE_DIR"):
        os.environ.pop("JAXCACHE_DIR", None)
        try:
            if how == "argument":
                enable_cache(text, job="t")
            else:
                os.environ["JAXCACHE_DIR"] = text
                enable_cache(job="t")
            out.append([text, how, None])
        except Exception as exc:
            out.append([text, how, f"{type(exc).__name__}: {exc}"])
print(json.dumps(out))
"""


def _meant(message: str) -> str:
    found = re.search(r"did you mean (\S+)\?", message)
    assert found is not None and "\n" not in message.strip(), message
    return found[1]


def test_the_client_refuses_a_root_spelled_amiss(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXCACHE_", "JAX_"))}
    proc = subprocess.run([sys.executable, "-c", CLIENT, json.dumps([text for text, _ in AMISS])], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**env, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    said = {(text, how): error for text, how, error in json.loads(proc.stdout)}
    for text, meant in AMISS:
        for how in ("argument", "JAXCACHE_DIR"):
            error = said[text, how]
            assert error is not None and error.startswith("InvalidRootError:"), (text, how, error)
            assert _meant(error) == meant, (text, how)
    assert list(tmp_path.iterdir()) == [], "no directory was made for a root spelled amiss"


@pytest.mark.parametrize(("text", "meant"), AMISS)
def test_the_cli_and_the_service_refuse_a_root_spelled_amiss(tmp_path, monkeypatch, capsys, text, meant):
    monkeypatch.chdir(tmp_path)
    for argv in (["ls", text], ["prune", text, "--corrupt", "--apply"], ["bundle", "import", "b.tar", text],
                 ["serve", "--cache", f"x={text}", "--db", f"sqlite:///{tmp_path}/catalog.sqlite"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and _meant(err) == meant, (argv, err)
    with pytest.raises(ValidationError, match=re.escape(f"did you mean {meant}?")):
        ServiceSettings(caches={"x": text})  # JAXCACHE_CACHES too
    assert list(tmp_path.iterdir()) == [], "no directory (nor catalog) was made for it"


def test_a_directory_with_a_colon_in_its_name_is_still_a_root(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for text in STILL_ROOTS:
        (tmp_path / text).mkdir(parents=True)
        assert normalise_root(text) == str(tmp_path / text.removeprefix("./"))
        assert main(["ls", text]) == 0, capsys.readouterr().err
        assert ServiceSettings(caches={"x": text}).caches == {"x": text}
    # file:/path, RFC 8089's own form (Java's File.toURI() writes it), is the directory; file:///path as ever.
    assert normalise_root(f"file:{tmp_path}") == normalise_root(f"file://{tmp_path}") == str(tmp_path)


# Names at the edges of each rule: each store's help must say what its rule does with them.
def _admits(scheme: str, bucket: str) -> bool:
    try:
        normalise_root(f"{scheme}://{bucket}/p")
    except InvalidRootError:
        return False
    return True


@pytest.mark.parametrize("scheme", sorted(STORES))
def test_each_bucket_help_says_what_its_rule_admits(scheme):
    store = STORES[scheme]
    with pytest.raises(InvalidRootError) as refused:
        normalise_root(f"{scheme}://-x-/p")
    assert store.bucket_help in str(refused.value)
    words = store.bucket_help
    least, most = map(int, re.match(r"(\d+)-(\d+) ", words).groups())
    assert _admits(scheme, "a" * least) and not _admits(scheme, "a" * (least - 1))
    assert _admits(scheme, "a" * most) and not _admits(scheme, "a" * (most + 1))
    assert _admits(scheme, "ab9c") and not _admits(scheme, "-abc") and not _admits(scheme, "abc-")
    assert "letter or digit at each end" in words
    # Capitals and underscores: named where the rule admits them (S3's older buckets), never where it does not.
    assert _admits(scheme, "Old-Bucket") == ("capitals" in words) == ("lowercase letters," not in words.split(":")[0])
    assert _admits(scheme, "old_bucket") == ("underscores" in words)
    assert _admits(scheme, "a.b") == ("dots" in words)
    assert (not _admits(scheme, "a--b")) == ("no two hyphens in a row" in words)
