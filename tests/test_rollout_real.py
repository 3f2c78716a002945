"""A rolling restart behind one URL, all real: Debian's haproxy (round robin, health checks on
``/ready``) in front of two ``pipecat-veena serve`` processes on the spark-tiny demo, each with
its own vLLM CPU engine; phone-call-like load through ``RemoteVeenaEngine`` (the calls of
benchmarks/load.py); each server restarted in turn as a Deployment rolls (SIGTERM, drain, a new
process on the same port, ``/ready``). No turn may fail, none may get audio twice, and none may
wait for its first audio longer than the handover bound.
"""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from server_fakes import ROOT
from servers import assert_no_turn_lost

sys.path.insert(0, str(ROOT))

from benchmarks._load_calls import CallPlan  # noqa: E402
from benchmarks.load import (  # noqa: E402
    ServeProcess,
    free_port,
    haproxy,
    rolling_restart,
    run_level,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: The drain handover bound: the longest a turn may wait for its first audio during the roll.
#: A turn that meets a draining server is refused at once (goaway / server_draining) and goes to
#: a new connection; haproxy takes the server out of rotation within one 500 ms check, so the
#: handover itself takes about a second, on top of the time to first audio under this load
#: (seconds on a shared 2-core CPU; milliseconds on a GPU). Generous, so that it cannot flake;
#: measure it with ``python -m benchmarks.load --roll spark-tiny``.
HANDOVER_BOUND_S = 20.0
#: The most the load may run: the roll (two vLLM CPU starts) must happen within it. The calls
#: end AFTER_ROLL_S after the roll is over, so the test takes the roll plus that.
DURATION_S = 900.0
AFTER_ROLL_S = 10.0
#: The servers' drain deadline: longer than any utterance takes here (a shared CPU generates
#: far slower than real time), so that no in-flight utterance is cut by the deadline itself.
DRAIN_TIMEOUT_S = "600"


@pytest.fixture
def servers(spark_tiny_checkpoint, tmp_path):
    """Two real servers on free ports (their logs in tmp_path), stopped at the end."""
    if shutil.which("haproxy", path="/usr/sbin:/usr/bin") is None:
        reason = "haproxy is not installed: run `make tools` (apt-get install haproxy)"
        # CI installs it (make test runs make tools): missing there is a failure, not a skip.
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    started = [
        ServeProcess(
            str(spark_tiny_checkpoint),
            free_port(),
            tmp_path / f"serve-{i}.log",
            args=("--drain-timeout", DRAIN_TIMEOUT_S),
        )  # fmt: skip
        for i in range(2)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:  # (both engines load at once)
            list(pool.map(ServeProcess.start, started))
        yield started
    finally:
        for server in started:
            server.stop()


async def test_a_rolling_restart_behind_haproxy_loses_no_turn(servers):
    plan = CallPlan(pause_s=(0.3, 1.5), hang_s=300.0)
    with haproxy([s.url for s in servers], free_port()) as url:
        level = await run_level(
            url, 3, DURATION_S, plan, seed=7, fault=rolling_restart(servers), fault_at_s=5.0,
            progress=False, after_fault_s=AFTER_ROLL_S,
        )  # fmt: skip
    print(level)  # the figures, for the report
    assert level["fault"].startswith("rolled 2 servers (exit statuses [0, 0])"), level["fault"]
    assert level["fault_done_s"] < DURATION_S, "the roll did not happen under load"
    assert_no_turn_lost(level, HANDOVER_BOUND_S)
