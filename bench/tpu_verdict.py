"""Sums up bench/tpu_check.sh's runs into $OUT/tpu_check.json: did every warmed program hit, with the cold run's
loss, and how much faster was the first step. Exit 0 only when every warmed program hit with the same loss."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(outdir: str, warmup_log: str) -> int:
    out = Path(outdir)

    def load(name: str) -> dict | None:
        path = out / name
        return json.loads(path.read_text()) if path.is_file() and path.stat().st_size else None

    check, warm, cold, warm2 = (load(n) for n in ("check.json", "warm.json", "cold.json", "warm2.json"))
    log = Path(warmup_log).read_text() if Path(warmup_log).is_file() else ""
    verdict: dict = {"check": check and {k: check.get(k) for k in ("programs", "hits", "coverage", "misses")},
                     "warm": warm, "cold": cold, "warm2": warm2, "cpu_warmup_log": log[-2000:]}
    ok = bool(check and check.get("programs") and check.get("hits") == check.get("programs"))
    for run in (warm, warm2):
        ok = ok and bool(run and run["misses"] == 0 and run["hits"] >= 1)
        if run and cold:
            ok = ok and run["losses"] == cold["losses"]
    if warm and cold:
        verdict["first_step_cold_over_warm"] = round(cold["first_step_s"] / warm["first_step_s"], 2)
        verdict["start_to_first_step_cold_over_warm"] = round(
            cold["start_to_first_step_s"] / warm["start_to_first_step_s"], 2)
    verdict["ok"] = ok
    (out / "tpu_check.json").write_text(json.dumps(verdict, indent=1))
    print(json.dumps({k: v for k, v in verdict.items() if k != "cpu_warmup_log"}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
