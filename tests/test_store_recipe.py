"""The user guide's recipe for trying s3:// and az:// on one's own machine, on moto and Azurite (#73): its shell
parses, and the environment it exports is the one the suite's own servers give their clients
(tests/store_servers.py), so the recipe points the same libraries at the same servers the tests run against."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from store_servers import AZURITE_ACCOUNT, azurite_connection_string

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "user-guide.md"


def _recipe() -> str:
    section = GUIDE.read_text().split("### Trying s3:// and az:// on your machine", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_the_recipe_is_shell_that_parses():
    proc = subprocess.run(["bash", "-n"], input=_recipe(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_the_recipe_exports_what_the_test_servers_give_their_clients():
    recipe = _recipe()
    exports = "\n".join(line for line in re.sub(r"\\\n", "", recipe).splitlines() if line.startswith("export "))
    shown = subprocess.run(["bash", "-c", f"{exports}\nenv -0"], capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin"}, check=True).stdout
    env = dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)
    assert env["AZURE_STORAGE_CONNECTION_STRING"] == azurite_connection_string("http://127.0.0.1:10000")
    assert "--blobPort 10000" in recipe and f"/{AZURITE_ACCOUNT}" in env["AZURE_STORAGE_CONNECTION_STRING"]
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:5000" and "moto_server -p 5000" in recipe
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env["AWS_DEFAULT_REGION"]) == (
        "testing", "testing", "us-east-1")
    # Each root's bucket or container is made before the job writes there: jaxcache and JAX make none.
    assert "create_bucket(Bucket='jax-cache')" in recipe and "create_container('jax-cache')" in recipe
    for root in ("s3://jax-cache/try", "az://jax-cache/try"):
        assert f"JAXCACHE_DIR={root} python -m jaxcache.warmup.examples" in recipe and f"jaxcache ls {root}" in recipe
