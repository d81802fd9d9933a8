"""The Azure SDK's own listing of a prefix, as a user would write it: ``ContainerClient.list_blobs(name_starts_with=)``,
each blob's size and name printed (as ``aws s3 ls --recursive`` prints them), or with ``--sum`` only the count and the
bytes (as ``gcloud storage du -s``). bench/stores.py's baseline for az:// roots; the account comes from
``AZURE_STORAGE_CONNECTION_STRING``.

    .venv/bin/python bench/az_list.py CONTAINER PREFIX [--sum]
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/az_list.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("container")
    parser.add_argument("prefix", help="list blobs whose names start with this (e.g. cache/)")
    parser.add_argument("--sum", action="store_true", help="print only the count and the total size")
    args = parser.parse_args(argv)
    from azure.storage.blob import ContainerClient

    client = ContainerClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"], args.container)
    count = size = 0
    lines = []
    for blob in client.list_blobs(name_starts_with=args.prefix):
        count += 1
        size += blob.size
        if not args.sum:
            lines.append(f"{blob.size} {blob.name}\n")
    sys.stdout.writelines(lines)
    print(f"{count} objects, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
