"""A run record as folding takes it (:class:`Report`): its header, its keys' figures as columns, its keys as the
record has them (their parts and programs are encoded for the catalog only where a usage row lacks them), and the
keys that carry a digest."""

from __future__ import annotations

import msgspec

from jaxcache.records import WRITE, KeyUsage, RunRecord
from jaxcache.service.ingestion.figures import Figures, of_record


class Report(msgspec.Struct, gc=False):
    """``header``: the record without its keys; ``usages``: its keys; ``digests``: the keys the process wrote and
    read back a digest of (its attestations)."""

    header: RunRecord
    figures: Figures
    usages: list[KeyUsage]
    digests: list[KeyUsage]

    @property
    def run_id(self) -> str:
        return self.header.run_id

    @property
    def process_index(self) -> int:
        return self.header.process_index

    @property
    def keys(self) -> list[str]:
        return self.figures.keys

    def attested(self) -> RunRecord:
        """The record with only the keys whose digests it carries: what :func:`jaxcache.attestations.from_run`
        reads."""
        return msgspec.structs.replace(self.header, keys=self.digests)


def report_of(record: RunRecord) -> Report:
    """``record`` (parsed, so valid) as ingestion takes it."""
    keys = record.keys
    return Report(msgspec.structs.replace(record, keys=[]), of_record(record), keys,
                  [u for u in keys if u.sha256 and u.event == WRITE])
