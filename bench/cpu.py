"""CPU seconds spent by each process on this machine over a stretch of a benchmark, from /proc (Linux): where a
storm's CPU went when the machine's cores are all busy and throughput alone cannot say which process limits it."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    command: str
    parent: int
    cpu_s: float
    started: int  # clock ticks after boot: tells a reused pid from the same process


def snapshot() -> dict[int, Proc]:
    """Every process's command line, parent, CPU seconds so far and start ({} without /proc)."""
    if not os.path.isdir("/proc/self"):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        out[int(name)] = Proc(command, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, int(fields[19]))
    return out


def by_role(before: dict[int, Proc], after: dict[int, Proc], serving: int | list[int]) -> dict[str, float]:
    """CPU seconds between two snapshots: the service's processes (the serving process and its workers), PostgreSQL's
    backends and its background processes (autovacuum and the like), the probes, this process (the storm's
    clients), and everything else. ``serving``: the pid of each ``jaxcache serve``."""
    served = {serving} if isinstance(serving, int) else set(serving)
    roles = {"service": 0.0, "postgres": 0.0, "postgres_background": 0.0, "probe": 0.0,
             "client": 0.0, "other": 0.0}
    for pid, now in after.items():
        was = before.get(pid)
        # The same process by its start, not its command line: PostgreSQL's backends retitle themselves with each
        # state ("idle", "UPDATE"), and a backend whose title changed had its whole life's CPU counted.
        spent = now.cpu_s - (was.cpu_s if was is not None and was.started == now.started else 0.0)
        if pid in served or now.parent in served:
            role = "service"
        elif now.command.startswith("postgres"):
            # Backends are titled "postgres: user database host(port) state"; autovacuum, the WAL writer and
            # the checkpointer by what they are.
            role = "postgres" if "(" in now.command else "postgres_background"
        elif pid == os.getpid():  # before the probe's test: this command line may hold --probe-gap-s
            role = "client"
        elif "--probe" in now.command:
            role = "probe"
        else:
            role = "other"
        roles[role] += spent
    return {role: round(seconds, 2) for role, seconds in roles.items()}
