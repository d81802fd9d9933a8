"""A store that stops answering, refuses connections or throttles costs a job seconds, not minutes (#71): real jobs
(tests/programs/client_job.py) on an s3:// root whose moto server is stopped (SIGSTOP: connections accepted, nothing
answered) or whose endpoint refuses connections, and behind the fault proxy answering 503 SlowDown (S3's
throttling) to a share of the requests. Each job runs under a watchdog (``timeout=``) far below what the old start
took (its first lookup still waiting after 420 s); what is asserted is that it finished, what it compiled, and what
it said."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from store_faults import S3Faults
from store_servers import Server, start_moto
from test_client_service import JOB
from test_local_tier import PROGRAMS, _node_env, entries, run_job

pytestmark = pytest.mark.slow

DEADLINE = {"JAXCACHE_LOOKUP_DEADLINE_S": "2"}  # short, so that the test is: the default is 10 s
WATCHDOG_S = 120  # far below the minutes a stopped store cost before; no timing is asserted


@pytest.fixture
def own_moto(tmp_path) -> Iterator[Server]:
    """A moto server of this test's own (it is stopped, which the session's must never be), pointed at."""
    folder = tmp_path / "moto"
    folder.mkdir()
    server = start_moto(folder)
    try:
        with server.pointed_at():
            yield server
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)  # a stopped process does not stop
        server.stop()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again at once: connections to it are refused


def watched_job(root: str, node, **env: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, str(JOB), "--cache-dir", root, "--job", "train"], capture_output=True,
                          text=True, timeout=WATCHDOG_S, env=_node_env(node, **DEADLINE, **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("fault", ["stopped", "refused"])
def test_a_store_that_does_not_answer_costs_a_job_one_deadline(tmp_path, own_moto, fault):
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/jc"
    node = tmp_path / "node"
    run_job(root, node, "train")  # the node holds copies, and the root's records name the job's working set
    local = node / "unchecked"
    held = set(entries(local))
    pending = local / ".jaxcache" / "pending"

    if fault == "stopped":
        os.kill(own_moto.proc.pid, signal.SIGSTOP)
        env = {}
    else:
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}
    try:
        out, err = watched_job(root, node, **env)
    finally:
        os.kill(own_moto.proc.pid, signal.SIGCONT)
    # Nothing checked, so nothing loaded: every program compiled, with right results (client_job checks them).
    assert out["stats"]["misses"] == len(PROGRAMS) and out["stats"]["hits"] == 0, out["stats"]
    assert err.count("JAX compiles what it cannot load") == 1, err  # said once, however many lookups
    assert "did not answer within 2 s" in err, err
    # JAX's own writes took the copies' places, their uploads not tried: they wait for the node's next job.
    assert set(entries(local)) == held and len(os.listdir(pending)) == len(PROGRAMS), os.listdir(pending)
    assert "upload" in err and "as it did not answer" in err, err

    again, _ = run_job(root, node, "train")  # the store answers again
    assert again["stats"]["hits"] == len(PROGRAMS) and again["stats"]["misses"] == 0, again["stats"]
    assert os.listdir(pending) == []


def test_a_throttling_store_starts_a_fleet_that_loads_everything_and_nothing_fails(tmp_path, moto_s3, s3_bucket):
    root = f"s3://{s3_bucket}/jc"
    run_job(root, tmp_path / "writer", "train")  # the entries, and the job's working-set index
    # Three empty nodes start at once, each through a proxy of its own (its log is that node's requests), each
    # answering SlowDown to its node's first read of the index and first two downloads of an entry.
    proxies = [S3Faults(moto_s3) for _ in range(3)]
    try:
        for proxy in proxies:
            proxy.fail(1, 503, method="GET", path="working-sets")
            proxy.fail(2, 503, method="GET", path=r"-cache$")
        jobs = [subprocess.Popen([sys.executable, str(JOB), "--cache-dir", root, "--job", "train"], text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=_node_env(tmp_path / f"node-{i}", AWS_ENDPOINT_URL=proxy.url))
                for i, proxy in enumerate(proxies)]
        done = [job.communicate(timeout=WATCHDOG_S) for job in jobs]
    finally:
        for proxy in proxies:
            proxy.close()
    for job, (stdout, stderr) in zip(jobs, done, strict=True):
        assert job.returncode == 0, stdout + stderr
        out = json.loads(stdout.strip().splitlines()[-1])
        # Every program loaded, the throttled reads retried by the library: nothing failed, nothing was given up.
        assert out["stats"]["hits"] == len(PROGRAMS) and out["stats"]["misses"] == 0, out["stats"]
        assert out["local"]["prefetched"] + out["local"]["fetched"] == len(PROGRAMS), out["local"]
        assert "could not" not in stderr and "did not answer" not in stderr, stderr
    waits = []
    for proxy in proxies:
        assert proxy.pending() == 0 and len(proxy.injected()) == 3, proxy.log
        for i, (method, path, status) in enumerate(proxy.log):
            if status == 503:
                again = next(t for (m, p, _), t in zip(proxy.log[i + 1:], proxy.arrived[i + 1:], strict=True)
                             if (m, p) == (method, path))
                waits.append(again - proxy.arrived[i])
    # The fleet's retries are spread out (the library backs off with jitter), not in step.
    assert len({round(w, 3) for w in waits}) > len(waits) // 2, waits
