"""`enable_cache(verify="signed")`, for real, on every supported JAX: jobs load only entries whose bytes a trusted key
signed, and compile the rest with the right results and the reason recorded (#34). Writers sign through
`JAXCACHE_SIGNING_KEY`; the attacks are what bucket write access can do: swap or truncate an entry, move a
signature to another key, sign with a key of one's own, delete a signature."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from jaxcache import signing, skips
from jaxcache.client import options as client_options
from jaxcache.errors import InvalidInputError
from test_client_service import PUBLIC, _env
from test_verified_loads import _entry, interpreter, run_job  # noqa: F401 - a fixture


@pytest.mark.slow
def test_signed_jobs_load_only_what_a_trusted_key_signed(tmp_path, interpreter):  # noqa: F811
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    signed = ("--verify", "signed")
    extra = {"JAXCACHE_TRUSTED_KEYS": PUBLIC}
    job = (interpreter[0], {**interpreter[1], **extra})
    run_job(interpreter, cache, "writer")  # signs the bytes JAX put, beside each entry
    clean = run_job(job, cache, "clean", *signed)
    assert clean["skipped"] == {} and clean["stats"]["misses"] == 0 and clean["stats"]["hits"] >= 4, clean["stats"]

    affine, gram, wave, loss = (_entry(cache, f) for f in ("affine", "gram", "wave", "loss"))
    sig = {p: cache / signing.sig_name(p.name.removesuffix("-cache")) for p in (affine, gram, wave, loss)}
    gram.write_bytes(affine.read_bytes())  # another program's bytes
    wave.write_bytes(wave.read_bytes()[: wave.stat().st_size // 2])  # truncated
    sig[loss].write_bytes(sig[affine].read_bytes())  # a valid signature, of another key
    out = run_job(job, cache, "careful", *signed)  # the job checks each result: the refused ones were compiled
    key = {p: p.name.removesuffix("-cache") for p in (affine, gram, wave, loss)}
    assert out["skipped"] == {key[gram]: skips.DIGEST_DIFFERS, key[wave]: skips.DIGEST_DIFFERS,
                              key[loss]: skips.BAD_SIGNATURE}, out["skipped"]
    assert out["stats"]["misses"] == 3 and out["stats"]["writes"] == 0, out["stats"]
    assert "3 skipped" in out["summary"] and f"rm -f {cache}" in out["summary"], out["summary"]

    # A signature by a key nobody trusts, over the right bytes, proves nothing; nor does a deleted one.
    data = affine.read_bytes()
    rogue = signing.new_key("rogue", str(tmp_path / "rogue.key"))
    sig[affine].write_bytes(signing.encode([rogue.sign(key[affine], hashlib.sha256(data).hexdigest(), len(data))]))
    sig[gram].unlink()
    again = run_job(job, cache, "again", *signed)
    assert again["skipped"][key[affine]] == skips.UNTRUSTED_KEY and again["skipped"][key[gram]] == skips.UNSIGNED
    record = json.loads((cache / again["record_name"]).read_text())
    usage = {u["key"]: u for u in record["keys"]}
    assert usage[key[affine]]["reason"] == skips.reason(skips.UNTRUSTED_KEY) and usage[key[affine]]["writes"] == 0

    # The command the summary prints, run as printed, ends every skip once a writer has run again: no signature
    # of the old bytes is left to refuse the new one (signatures are created only once).
    command = skips.removal(str(cache), again["skipped"])
    assert command in again["summary"]
    subprocess.run(command, shell=True, check=True)
    run_job(interpreter, cache, "rewriter")
    healed = run_job(job, cache, "healed", *signed)
    assert healed["skipped"] == {} and healed["stats"]["misses"] == 0, (healed["skipped"], healed["stats"])


def test_signed_needs_trusted_keys(tmp_path):
    """Without JAXCACHE_TRUSTED_KEYS, verify='signed' would refuse every entry: a setting error, said at once."""
    args = dict(job=None, min_compile_time_secs=None, min_entry_size_bytes=None, xla_caches=None, max_size_bytes=None,
                service_url=None, token=None, trust="strict", default_xla_caches="none", verify="signed")
    with pytest.raises(InvalidInputError, match="JAXCACHE_TRUSTED_KEYS"):
        client_options.resolve(str(tmp_path), env={}, **args)
    assert client_options.resolve(str(tmp_path), env={"JAXCACHE_TRUSTED_KEYS": PUBLIC}, **args).verify == "signed"


@pytest.mark.parametrize("mode", ["signed", "attested"])
def test_a_jax_whose_loads_cannot_be_judged_refuses_to_verify(tmp_path, mode):
    """A JAX that moved the code the read hook wraps would let a verifying job load every entry unchecked: the job
    is told so at enable_cache, before JAX is pointed at the cache, instead of starting unverified."""
    script = f"""
import jax._src.compilation_cache as cc
cc.get_executable_and_time = lambda *args, **kwargs: (None, None)  # a JAX whose cache read moved elsewhere
import jax
from jaxcache.client import VerifyUnavailableError, enable_cache
try:
    enable_cache({str(tmp_path)!r}, verify={mode!r}, service_url="http://127.0.0.1:9", local_dir="off")
except VerifyUnavailableError as exc:
    print("refused:", exc)
    print("cache dir:", jax.config.jax_compilation_cache_dir)
"""
    tmp_path.chmod(0o700)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=_env(JAXCACHE_TRUSTED_KEYS=PUBLIC))
    assert proc.returncode == 0, proc.stderr
    assert f"refused: verify='{mode}'" in proc.stdout and "get_executable_and_time" in proc.stdout, proc.stdout
    assert "cache dir: None" in proc.stdout, proc.stdout  # nothing was configured
