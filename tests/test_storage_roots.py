"""Cache roots by URL: every spelling a client may send names one root (storage.normalise_root) and reaches its
cache; the store table (storage.STORES) is the only place that knows a scheme; a store's library is imported only
when one of its roots is opened, and its absence is one clear error naming the extra."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from jaxcache.errors import InvalidRootError
from jaxcache.storage import STORES, is_object_store, normalise_root, open_storage, scheme_of
from store_servers import BUCKETS

# How a user may write one root: a slash at the end, doubled slashes, blanks around it.
SPELLINGS = ["{s}://{b}/team/jax-cache", "{s}://{b}/team/jax-cache/", "{s}://{b}//team//jax-cache",
             "  {s}://{b}/team/jax-cache\n", "{s}://{b}/team/jax-cache//"]


def test_every_store_has_a_module_and_a_fixture():
    assert set(STORES) == set(BUCKETS) == {"gs", "s3", "az"}
    for store in STORES.values():
        assert store.module.startswith("jaxcache.storage.") and store.cls.endswith("Storage")


@pytest.mark.parametrize("scheme", sorted(BUCKETS))
def test_every_spelling_reaches_the_same_cache(request, scheme):
    bucket = request.getfixturevalue(BUCKETS[scheme])
    root = f"{scheme}://{bucket}/team/jax-cache"
    open_storage(root).write_atomic("k-cache", b"entry")
    for spelling in SPELLINGS:
        text = spelling.format(s=scheme, b=bucket)
        assert normalise_root(text) == root
        assert scheme_of(text) == scheme and is_object_store(text)
        storage = open_storage(text)
        assert storage.url == root and storage.read("k-cache") == b"entry"
    assert normalise_root(f"{scheme}://{bucket}/") == f"{scheme}://{bucket}"


def test_local_spellings(tmp_path, monkeypatch):
    real = tmp_path / "cache"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for spelling in [str(real), f"{real}/", f"file://{real}", f"file://localhost{real}", "./cache/", "cache",
                     "~/cache", str(tmp_path / "link"), f" {real} "]:
        assert normalise_root(spelling) == str(real), spelling
        assert scheme_of(spelling) is None and not is_object_store(spelling)
    assert normalise_root("file:///a%20b") == "/a b"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty cache root"),
        ("   ", "empty cache root"),
        ("file://host/p", "must name a local path"),
        ("http://host/p", "unsupported scheme 'http'"),
        ("S3://bucket/p", "did you mean s3://bucket/p"),
        ("gcs://bucket/p", "write gs://"),
        ("s3a://bucket/p", "write s3://"),
        ("abfss://container/p", "write az://"),
        ("az://container@account/p", "names the container only"),
        ("az://co--ntainer/p", "not a valid container name"),
        ("az://ab/p", "not a valid container name"),
        ("s3://ab/p", "not a valid bucket name"),
        ("s3://-bucket/p", "not a valid bucket name"),
        ("gs://bucket/a/../b", "not a clean path"),
        ("s3://bucket/./b", "not a clean path"),
        ("az://container/a\\b", "not a clean path"),
    ],
)
def test_what_is_no_root(url, message):
    with pytest.raises(InvalidRootError, match=message):
        normalise_root(url)
    with pytest.raises(InvalidRootError, match=message):
        open_storage(url)


def test_legacy_s3_bucket_names_are_roots():
    assert normalise_root("s3://Old_Bucket.Name/p") == "s3://Old_Bucket.Name/p"


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys; {code}; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, env={**os.environ, "AWS_ACCESS_KEY_ID": "x",
                                                                          "AWS_SECRET_ACCESS_KEY": "y"}).stdout
    return {m.split(".")[0] for m in out.split()} | {".".join(m.split(".")[:2]) for m in out.split()}


def test_store_libraries_load_only_for_their_roots():
    loaded = _loaded_after("from jaxcache.storage import normalise_root, open_storage; "
                           "[normalise_root(u) for u in ('gs://b-1/p', 's3://b-1/p', 'az://b-1/p')]; open_storage('.')")
    assert not loaded & {"boto3", "botocore", "azure", "google.cloud"}
    assert "botocore" in _loaded_after("from jaxcache.storage import open_storage; open_storage('s3://b-1/p')")
    assert "azure.storage" in _loaded_after("import jaxcache.storage.azure")


@pytest.mark.parametrize(("url", "library", "extra"), [("s3://b-1/p", "botocore", "s3"),
                                                        ("az://b-1/p", "azure", "azure"),
                                                        ("gs://b-1/p", "google", "gcs")])
def test_a_missing_library_names_its_extra(url, library, extra):
    """Without the store's library (hidden from the import system here), opening its root says what to install."""
    code = (f"import sys; sys.modules[{library!r}] = None\n"
            "from jaxcache.cli import main\n"
            f"sys.exit(main(['ls', {url!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    # What it names can be installed: the library from the package index, or the core's extra from a clone (no
    # jaxcache distribution is on an index).
    said = proc.stderr.strip()
    assert said.endswith(f"pip install './core[{extra}]')") and proc.stderr.count("\n") == 1, said
    extras = tomllib.loads((Path(__file__).parent.parent / "core" / "pyproject.toml").read_text())
    assert extra in extras["project"]["optional-dependencies"]
    assert "jaxcache[" not in said
