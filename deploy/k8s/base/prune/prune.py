"""Nightly prune: apply each cache's policy through the service (POST /v1/caches/{cache}/prune, dry_run false).

Runs in the service image with the standard library only. Reads the service URL and an admin token from
JAXCACHE_SERVICE_URL and JAXCACHE_TOKEN, and cache name -> policy from policies.json beside this file (a policy
may say "dry_run": true to rehearse). Exits 1 if any cache's prune failed or reported errors, so the Job shows it.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

# A prune of a large bucket deletes many objects; the service answers only when it is done.
TIMEOUT_S = 3600


def prune(base_url: str, token: str, cache: str, policy: dict) -> bool:
    body = json.dumps({"dry_run": False, **policy}).encode()
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/v1/caches/{urllib.parse.quote(cache, safe='')}/prune",
        data=body,
        method="POST",
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            result = json.load(response)
    except urllib.error.HTTPError as exc:
        print(f"{cache}: HTTP {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return False
    except OSError as exc:
        print(f"{cache}: cannot reach {base_url}: {exc}", file=sys.stderr)
        return False
    summary = {k: result.get(k) for k in ("dry_run", "entries_total", "deleted", "bytes_freed", "bytes_remaining",
                                          "already_gone", "changed", "errors", "audit_id")}
    print(json.dumps({"cache": cache, **summary}), flush=True)
    return not result.get("errors")


def main() -> int:
    base_url = os.environ["JAXCACHE_SERVICE_URL"]
    token = os.environ["JAXCACHE_TOKEN"]
    policies = json.loads((Path(__file__).with_name("policies.json")).read_text())
    results = [prune(base_url, token, cache, policy) for cache, policy in policies.items()]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
