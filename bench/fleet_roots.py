"""A bench root on an object store's emulator, written fast through the store's own client library (boto3,
google-cloud-storage, azure-storage-blob), many requests in flight: filler objects named like JAX's entries
(``jit_filler-<64 hex>-cache``, a few bytes each) up to a size, and run records of other jobs under
``.jaxcache/runs/<day>/`` (copies of a real record with another job name and run id), so that a start which lists
the root or reads records has the work a shared root gives it. bench/fleet_start.py uses it."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from entries import Progress

RUNS = ".jaxcache/runs/"
FILLER_MODULE = "jit_filler"


class Bucket:
    """One bucket (Azure: container) of an emulator, created here, reached through the store's client library the
    environment points at it: ``put`` many objects, list names under a prefix, read one."""

    def __init__(self, scheme: str, name: str, workers: int) -> None:
        self.scheme, self.name, self.workers = scheme, name, workers
        # A full connection pool only logs: more threads than connections just wait for one.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        if scheme == "s3":
            import boto3
            from botocore.config import Config

            self._s3 = boto3.client("s3", config=Config(max_pool_connections=workers))
            self._s3.create_bucket(Bucket=name)
        elif scheme == "gs":
            from google.cloud import storage

            self._gs = storage.Client().create_bucket(name)
        elif scheme == "az":
            from azure.storage.blob import BlobServiceClient

            service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
            self._az = service.create_container(name)
        else:
            raise ValueError(f"unknown scheme {scheme!r}")

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "s3":
            self._s3.put_object(Bucket=self.name, Key=key, Body=data)
        elif self.scheme == "gs":
            self._gs.blob(key).upload_from_string(data)
        else:
            self._az.upload_blob(key, data, overwrite=True)

    def put_many(self, items: Iterable[tuple[str, bytes]], total: int, what: str) -> float:
        """Write every ``(key, data)``, ``workers`` at a time; seconds taken."""
        began = time.perf_counter()
        progress = Progress(total, what)
        try:
            with ThreadPoolExecutor(self.workers) as pool:
                for _ in pool.map(lambda item: self.put(*item), items):
                    progress.update()
        finally:
            progress.close()
        return time.perf_counter() - began

    def names(self, prefix: str) -> list[str]:
        """The keys under ``prefix``."""
        if self.scheme == "s3":
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
            return [o["Key"] for page in pages for o in page.get("Contents", [])]
        if self.scheme == "gs":
            return [b.name for b in self._gs.client.list_blobs(self.name, prefix=prefix)]
        return [b.name for b in self._az.list_blobs(name_starts_with=prefix)]

    def get(self, key: str) -> bytes:
        if self.scheme == "s3":
            return self._s3.get_object(Bucket=self.name, Key=key)["Body"].read()
        if self.scheme == "gs":
            return self._gs.blob(key).download_as_bytes()
        return self._az.download_blob(key).readall()


def filler(prefix: str, start: int, stop: int) -> Iterable[tuple[str, bytes]]:
    """Filler objects ``start`` .. ``stop - 1`` under ``prefix``: named like entries, not JAX's bytes (nothing in a
    start reads them; a listing sees them)."""
    for i in range(start, stop):
        yield (f"{prefix}{FILLER_MODULE}-{hashlib.sha256(b'filler %d' % i).hexdigest()}-cache",
               b"filler %d\n" % i)


def other_records(prefix: str, template: bytes, days: int, per_day: int, now: float) -> list[tuple[str, bytes]]:
    """``per_day`` records of other jobs in each of the last ``days`` days' folders: ``template`` (a real record)
    with another job name, run id and start time."""
    record = json.loads(template)
    out = []
    for back in range(days):
        at = now - back * 86400.0
        day = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d")
        for n in range(per_day):
            run_id = f"other{day.replace('-', '')}n{n:04d}"
            shifted = {**record, "job": f"other-job-{n % 7}", "run_id": run_id,
                       "started_at": at - 60.0, "updated_at": at}
            out.append((f"{prefix}{RUNS}{day}/{run_id}-p0.json", json.dumps(shifted).encode()))
    return out


def newest_record(bucket: Bucket, prefix: str, job_of: Callable[[dict], bool]) -> bytes:
    """The bytes of a record under ``prefix``'s runs folder whose JSON ``job_of`` accepts (a template)."""
    for key in sorted(bucket.names(f"{prefix}{RUNS}"), reverse=True):
        data = bucket.get(key)
        if job_of(json.loads(data)):
            return data
    raise SystemExit(f"no run record under {bucket.scheme}://{bucket.name}/{prefix}{RUNS} to copy")
