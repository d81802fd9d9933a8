"""A store's setup that cannot work is one line naming the variable to fix (#72 item 4): ``AWS_ENDPOINT_URL=notaurl``
ended `jaxcache ls s3://...` and `jaxcache serve` in botocore's ``ValueError: Invalid endpoint`` traceback, and other
settings were tried for minutes (``https://notaurl``) or named nothing. Each is an InvalidInputError: the CLI and
`jaxcache serve` exit 2, as for other bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import serve_env
from jaxcache.cli import main
from jaxcache.errors import InvalidInputError
from jaxcache.storage import open_storage
from ports import free_port
from store_servers import _AWS_ENV, _AZURE_ENV, _GCS_ENV, AZURITE_ACCOUNT, AZURITE_KEY

AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/none"}


def _connection(**fields: str) -> str:
    given = {"DefaultEndpointsProtocol": "http", "AccountName": AZURITE_ACCOUNT, "AccountKey": AZURITE_KEY,
             "BlobEndpoint": f"http://127.0.0.1:1/{AZURITE_ACCOUNT}", **fields}
    return ";".join(f"{k}={v}" for k, v in given.items()) + ";"


#: (root, environment, the variable the one line names)
CASES = {
    "endpoint not a URL": ("s3://bucket/c", {**AWS, "AWS_ENDPOINT_URL": "notaurl"}, "AWS_ENDPOINT_URL="),
    "S3 endpoint unparsable": ("s3://bucket/c", {**AWS, "AWS_ENDPOINT_URL_S3": "http://[::1"}, "AWS_ENDPOINT_URL_S3="),
    "attempts not a number": ("s3://bucket/c", {**AWS, "AWS_MAX_ATTEMPTS": "abc"}, "AWS_MAX_ATTEMPTS="),
    "no such retry mode": ("s3://bucket/c", {**AWS, "AWS_RETRY_MODE": "bogus"}, "AWS_RETRY_MODE="),
    "region not a region": ("s3://bucket/c", {**AWS, "AWS_DEFAULT_REGION": "bad region!"}, "AWS_DEFAULT_REGION"),
    "BlobEndpoint not a URL": ("az://container/c", {"AZURE_STORAGE_CONNECTION_STRING": _connection(
        BlobEndpoint="notaurl")}, "BlobEndpoint="),
    "AccountKey not base64": ("az://container/c", {"AZURE_STORAGE_CONNECTION_STRING": _connection(
        AccountKey="not-base64!")}, "AccountKey"),
    "account not a name": ("az://container/c", {"AZURE_STORAGE_ACCOUNT_NAME": "bad name!",
                                                "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY},
                           "AZURE_STORAGE_ACCOUNT_NAME="),
    "account key not base64": ("az://container/c", {"AZURE_STORAGE_ACCOUNT_NAME": "acct",
                                                    "AZURE_STORAGE_ACCOUNT_KEY": "not-base64!"},
                               "AZURE_STORAGE_ACCOUNT_KEY"),
    "emulator without a scheme": ("gs://bucket/c", {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"},
                                  "STORAGE_EMULATOR_HOST="),
    "credentials not JSON": ("gs://bucket/c", {"GOOGLE_APPLICATION_CREDENTIALS": "{not_json}"},
                             "GOOGLE_APPLICATION_CREDENTIALS="),
}


@pytest.fixture
def settings(monkeypatch, tmp_path):
    """Set a case's environment, and nothing else of any store's."""
    def use(env: dict[str, str]) -> None:
        for name in (*_AWS_ENV, *_GCS_ENV, *_AZURE_ENV, "GOOGLE_APPLICATION_CREDENTIALS"):
            monkeypatch.delenv(name, raising=False)
        not_json = tmp_path / "credentials.json"
        not_json.write_text("not json")
        for name, value in env.items():
            monkeypatch.setenv(name, value.replace("{not_json}", str(not_json)))
    return use


@pytest.mark.parametrize("case", list(CASES))
def test_a_store_setting_that_cannot_work_is_one_line_naming_it(case, settings, capsys):
    root, env, named = CASES[case]
    settings(env)
    with pytest.raises(InvalidInputError, match=named):
        open_storage(root)
    assert main(["ls", root]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and named in err and "Traceback" not in err, err


def test_serve_says_a_store_setting_that_cannot_work_in_one_line(tmp_path):
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxcache", "serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'c.sqlite'}",
         "--cache", "c=s3://bucket/c"], capture_output=True, text=True, timeout=120,
        env=serve_env(**AWS, AWS_ENDPOINT_URL="notaurl"))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and said.count("\n") == 1 and "AWS_ENDPOINT_URL='notaurl'" in said, said
