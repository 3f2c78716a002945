"""What an operator sees of real traffic: a real server over the real engine (vLLM CPU on the
demo checkpoint) scraped after real utterances (every metric the dashboard and the alert rules
read is there, the engine's figures have values), one request id in every log line about an
utterance from RemoteVeenaEngine through the server to the engine. (``pipecat-veena serve
--log-format json`` as a process: test_server_real.py's serve-command test, with its drain.)
"""

from __future__ import annotations

import httpx
import pytest
import pytest_asyncio
from loguru import logger
from server_fakes import RawClient
from test_observability import alert_queries, dashboard_queries, metric_names, samples, value

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.remote import RemoteVeenaEngine
from pipecat_veena.server import ServerHandle, ServerSettings, create_app

pytestmark = pytest.mark.vllm


@pytest_asyncio.fixture(scope="module")
async def served(spark_tiny_checkpoint, spark_generator):
    """(engine, server): the real engine (sharing the session's vLLM) behind a real server."""
    config = EngineConfig(
        checkpoint=spark_tiny_checkpoint, warmup=False, max_model_len=2048, log_requests=True
    )
    engine = VeenaEngine(config, generator=spark_generator)
    await engine.start()
    settings = ServerSettings(max_streams=12)
    handle = await ServerHandle(create_app(engine, settings, owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        yield engine, handle
    finally:
        await handle.stop()
        await engine.shutdown()


async def test_every_metric_of_the_dashboard_and_alerts_is_on_a_real_scrape(served):
    _, server = served
    async with RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "a", "text": "Watching the server work."})
        await client.send({"type": "speak", "id": "b", "text": "Two at once, batched."})
        ends = await client.until_all_end(["a", "b"])  # "b" may end first
    assert [ends[uid].reason for uid in ("a", "b")] == ["completed", "completed"]
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:  # a busy CPU
        r = await http.post("/v1/audio/speech", json={"input": "And one over HTTP."})
        assert r.status_code == 200
        text = (await http.get("/metrics")).text
    scraped = {name for name, _ in samples(text)}
    queries = [*dashboard_queries(), *alert_queries().values()]
    used = set().union(*(metric_names(q) for q in queries))
    assert len(used) >= 10
    assert not used - scraped, f"not on /metrics: {sorted(used - scraped)}"
    # the engine's own figures have real values
    assert value(text, "veena_queue_wait_seconds_count", api="ws") == 2
    assert value(text, "veena_queue_wait_seconds_count", api="http") == 1
    assert value(text, "veena_decode_batch_size_count") >= 3
    assert value(text, "veena_decode_batch_size_sum") >= value(
        text, "veena_decode_batch_size_count"
    )
    assert value(text, "veena_llm_tokens_total", api="ws") > 0
    assert value(text, "veena_llm_tokens_per_second_count", api="ws") == 2
    assert value(text, "veena_real_time_margin_seconds_count", api="ws") >= 2
    assert value(text, "veena_waiting_streams") == 0 and value(text, "veena_stream_capacity") == 12


async def test_one_request_id_from_the_remote_engine_through_the_server_to_the_engine(served):
    _, server = served
    records: list[dict] = []
    sink = logger.add(lambda m: records.append(m.record), level="DEBUG")
    try:
        async with RemoteVeenaEngine(server.url) as remote:
            pcm = b"".join([c.pcm async for c in remote.stream("Follow me.", request_id="call42")])
    finally:
        logger.remove(sink)
    assert pcm
    about = [r for r in records if r["extra"].get("request_id") == "call42-1"]
    where = {r["name"] for r in about}
    # the client's line, the server's, and the engine's (its request log and its done)
    assert {
        "pipecat_veena.remote.engine",
        "pipecat_veena.server.speech",
        "pipecat_veena.engine.utterance",
    } <= where, [(r["name"], r["message"]) for r in records]
    server_ids = {
        r["extra"]["server_request_id"] for r in about if "server_request_id" in r["extra"]
    }
    assert len(server_ids) == 1 and server_ids.pop().startswith("ws-")
    # every engine line about that request carries the id (none lost between the hops)
    engine_lines = [r for r in records if r["name"] == "pipecat_veena.engine.utterance"]
    assert engine_lines and all(r["extra"].get("request_id") == "call42-1" for r in engine_lines)
