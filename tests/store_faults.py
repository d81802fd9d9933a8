"""tests/gcs_faults.py's fault-injecting proxy in front of moto's S3 server or Azurite, answering injected faults as
S3 and Azure Blob Storage do (an XML error with the store's code), so that boto3's and azure-storage-blob's own
retries meet what they would meet from the real store.

Point a client at :attr:`~gcs_faults.GcsFaults.url` the way users point it at a store: ``AWS_ENDPOINT_URL`` for S3;
for Azure, a connection string whose ``BlobEndpoint`` is the proxy (store_servers.azurite_connection_string).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from gcs_faults import GcsFaults


def _xml_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message><RequestId>injected</RequestId></Error>").encode()


class S3Faults(GcsFaults):
    """The proxy in front of moto's S3 server: 503 is S3's throttling (SlowDown)."""

    REASONS = {403: "AccessDenied", 500: "InternalError", 501: "NotImplemented", 503: "SlowDown"}

    def error_answer(self, status: int) -> tuple[list[tuple[str, str]], bytes]:
        return [("Content-Type", "application/xml")], _xml_error(self.REASONS[status], f"injected from {self.url}")


class AzureFaults(GcsFaults):
    """The proxy in front of Azurite: 503 is Azure Storage's throttling (ServerBusy)."""

    REASONS = {403: "AuthorizationFailure", 500: "InternalError", 503: "ServerBusy"}

    def error_answer(self, status: int) -> tuple[list[tuple[str, str]], bytes]:
        code = self.REASONS[status]
        return ([("Content-Type", "application/xml"), ("x-ms-error-code", code)],
                _xml_error(code, f"injected from {self.url}"))
