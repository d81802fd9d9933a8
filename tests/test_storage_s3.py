"""What S3 does its own way, on moto's S3 server through boto3: ETags as versions, If-None-Match creates, If-Match
deletes and reads, the library's retries, and the errors a user meets (no credentials, no bucket).

Requests are watched through botocore's own event hooks on a session the test hands to S3Storage; faults come from
tests/store_faults.py's proxy."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import botocore.session
import pytest

from jaxcache import signing
from jaxcache.cli import main
from jaxcache.errors import InvalidRootError, PreconditionFailedError, StorageError
from jaxcache.storage import open_storage
from jaxcache.storage.s3 import MAX_ATTEMPTS, S3Storage
from store_faults import S3Faults

pytestmark = pytest.mark.slow


def _watched(events: dict[str, list], **handlers) -> botocore.session.Session:
    """A botocore session whose S3 clients record each call's parameters (``events[operation]``) and each sent
    request's method, URL and headers (``events["sent"]``), and run ``handlers`` (event name -> handler). A client
    takes the session's handlers when it is made: register them all here."""
    session = botocore.session.get_session()

    def called(params, model, **_):
        events.setdefault(model.name, []).append(dict(params))

    def sent(request, **_):
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        events.setdefault("sent", []).append((request.method, request.url, headers))

    session.register("before-parameter-build.s3", called)
    session.register("before-send.s3", sent)
    for event, handler in handlers.items():
        session.register(event, handler)
    return session


@pytest.fixture
def faults(moto_s3, monkeypatch) -> Iterator[S3Faults]:
    """The fault proxy in front of moto, named by AWS_ENDPOINT_URL: S3 clients created from now on go through it."""
    proxy = S3Faults(moto_s3)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        yield proxy
    finally:
        proxy.close()


def test_a_create_whose_answer_was_lost_is_accepted(faults, s3_client, s3_bucket):
    """moto creates the object, the answer is lost, botocore sends the PUT again and S3 answers 412: the object holds
    exactly our bytes, so the create happened. Someone else's bytes there are still refused."""
    storage = open_storage(f"s3://{s3_bucket}/c")
    faults.drop(1, method="PUT")
    storage.write_atomic("k-cache", b"ours", create_only=True)
    assert [e[2] for e in faults.log if e[0] == "PUT"] == ["dropped", 412]
    assert s3_client.get_object(Bucket=s3_bucket, Key="c/k-cache")["Body"].read() == b"ours"
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic("k-cache", b"theirs", create_only=True)


def test_delete_of_a_replaced_object_is_refused(s3_bucket):
    storage = open_storage(f"s3://{s3_bucket}/c")
    storage.write_atomic("e-cache", b"v1")
    listed = storage.stat("e-cache")
    storage.write_atomic("e-cache", b"v2")
    with pytest.raises(PreconditionFailedError, match="changed since it was listed"):
        storage.delete("e-cache", if_version=listed.version)
    assert storage.read("e-cache") == b"v2"
    assert storage.delete("e-cache", if_version=storage.stat("e-cache").version) is True
    assert storage.read("e-cache") is None


def test_s3_refuses_a_delete_whose_object_was_replaced_after_the_check(s3_client, s3_bucket):
    """The object is replaced between the check (a HEAD) and the DELETE: the DELETE's If-Match makes S3 refuse it."""
    events: dict[str, list] = {"armed": []}

    def replace_once(**_):
        if events["armed"]:
            events["armed"].clear()
            s3_client.put_object(Bucket=s3_bucket, Key="c/e-cache", Body=b"v2")

    storage = S3Storage(s3_bucket, "c", session=_watched(events, **{"before-call.s3.DeleteObject": replace_once}))
    storage.write_atomic("e-cache", b"v1")
    listed = storage.stat("e-cache")
    events["armed"].append(True)
    with pytest.raises(PreconditionFailedError):
        storage.delete("e-cache", if_version=listed.version)
    assert events["DeleteObject"][0]["IfMatch"] == listed.version
    assert storage.read("e-cache") == b"v2"


def test_a_store_without_conditional_deletes_is_checked_just_before(faults, s3_bucket):
    """An S3-compatible store that answers If-Match on DELETE with 501: the delete goes on without it (the HEAD just
    before is the check), and later deletes no longer send it."""
    events: dict[str, list] = {}
    storage = S3Storage(s3_bucket, "c", session=_watched(events))
    for name in ("a-cache", "b-cache"):
        storage.write_atomic(name, b"x")
    faults.fail(1, 501, method="DELETE")
    assert storage.delete("a-cache", if_version=storage.stat("a-cache").version) is True
    assert storage.delete("b-cache") is True
    assert storage.read("a-cache") is None and storage.read("b-cache") is None
    assert ["IfMatch" in p for p in events["DeleteObject"]] == [True, False, False]


def test_a_store_without_conditional_writes_is_checked_just_before(faults, s3_bucket):
    """An S3-compatible store that answers If-Match on PutObject with 501: a conditional replace goes on without it
    once a HEAD just before saw the version read, later ones no longer send it, and a stale version is still
    refused (by that HEAD)."""
    events: dict[str, list] = {}
    storage = S3Storage(s3_bucket, "c", session=_watched(events))
    storage.write_atomic("index", b"one")
    first = storage.version_token(storage.stat("index"))
    faults.fail(1, 501, method="PUT")
    storage.write_atomic("index", b"two", if_version=first)
    assert storage.read("index") == b"two"
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic("index", b"three", if_version=first)
    storage.write_atomic("index", b"three", if_version=storage.version_token(storage.stat("index")))
    assert storage.read("index") == b"three"
    assert ["IfMatch" in p for p in events["PutObject"]] == [False, True, False, False]


def test_a_signature_object_is_read_with_one_bounded_ranged_get(s3_bucket):
    """A `-sig` object is read up to signing.MAX_SIG_BYTES + 1, however large it is: one GET with a Range."""
    events: dict[str, list] = {}
    storage = S3Storage(s3_bucket, "c", session=_watched(events))
    storage.write_atomic(signing.sig_name("k"), os.urandom(1 << 20))
    events.clear()
    data = signing.read_object(storage, "k")
    assert len(data) == signing.MAX_SIG_BYTES + 1
    [(method, _, headers)] = events["sent"]
    assert method == "GET" and headers["Range"] == f"bytes=0-{signing.MAX_SIG_BYTES}"


def test_throttling_and_server_errors_are_retried_by_botocore(faults, s3_bucket):
    storage = open_storage(f"s3://{s3_bucket}/c")
    for i in range(3):
        storage.write_atomic(f"k{i}-cache", b"x" * 100)
    listing = r"list-type=2"
    faults.fail(2, 503, path=listing)  # SlowDown
    faults.fail(1, 500, method="GET", path=r"/k1-cache")
    assert [o.name for o in storage.iter_objects()] == ["k0-cache", "k1-cache", "k2-cache"]
    assert storage.read("k1-cache") == b"x" * 100
    assert faults.pending() == 0 and len(faults.injected()) == 3


def test_retries_are_botocores_own_settings(faults, s3_bucket, monkeypatch):
    """AWS_MAX_ATTEMPTS, read by botocore itself, bounds the tries: one try meets the 503 and fails, with the fix."""
    storage = open_storage(f"s3://{s3_bucket}/c")
    storage.write_atomic("k-cache", b"x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    faults.fail(1, 503, method="GET")
    with pytest.raises(StorageError, match="SlowDown"):
        open_storage(f"s3://{s3_bucket}/c").read("k-cache")
    assert S3Storage(s3_bucket, "c")._client.meta.config.retries["total_max_attempts"] == 1
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")
    assert S3Storage(s3_bucket, "c")._client.meta.config.retries == {
        "mode": "standard", "total_max_attempts": MAX_ATTEMPTS}


def test_no_credentials_is_one_clear_error(moto_s3, s3_bucket, monkeypatch, capsys):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    with pytest.raises(StorageError, match="no AWS credentials for s3://.*AWS_ACCESS_KEY_ID"):
        open_storage(f"s3://{s3_bucket}/c")
    assert main(["ls", f"s3://{s3_bucket}/c"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxcache: error: no AWS credentials") and err.count("\n") == 1


def test_rejected_credentials_say_so(faults, s3_bucket):
    faults.fail(1, 403)
    with pytest.raises(StorageError, match="permission denied .*s3:ListBucket"):
        list(open_storage(f"s3://{s3_bucket}/c").iter_objects())


def test_a_bucket_that_does_not_exist(moto_s3, capsys):
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    storage = open_storage(url)
    with pytest.raises(InvalidRootError, match="does not exist"):
        list(storage.iter_objects())
    with pytest.raises(InvalidRootError, match="does not exist"):
        storage.read("k-cache")
    assert main(["ls", url]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_endpoint_is_part_of_the_identity(moto_s3, s3_bucket):
    assert open_storage(f"s3://{s3_bucket}/c").identity == f"s3://{s3_bucket}/c at {moto_s3}"
