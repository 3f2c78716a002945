"""The codec grammar holds under extreme sampling, through the real vLLM CPU engine.

vLLM applies the repetition penalty in float32 after the grammar's logits processor has set
the forbidden ids to -inf. A penalty of 1e-300 (once inside the documented range) rounds to 0
there: -inf * 0 is NaN, and the model "emitted" 65 ids that are not codec tokens
(``generation_failed``, a retryable 500). Now the range is [1e-9, 1e9]: at its ends every id
still follows the grammar, and past them the request is refused (``bad_options``) before any
work, over the WebSocket as from the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from recording import RecordingGenerator
from server_fakes import RawClient
from servers import engine_behind_server

from pipecat_veena.engine import EngineConfig
from pipecat_veena.generation import SamplingOptions, TokenDelta
from pipecat_veena.generation.base import MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY

pytestmark = pytest.mark.vllm


class _GrammarRecorder(RecordingGenerator):
    """Also keeps each request's grammar."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.grammars: dict[str, object] = {}

    def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        self.grammars[request_id] = options.grammar
        return super().generate(prompt_ids, options, request_id)


@pytest_asyncio.fixture(scope="module")
async def served(spark_tiny_checkpoint, spark_generator):
    recorder = _GrammarRecorder(spark_generator)
    config = EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False, pin_voices=False)
    async with engine_behind_server(config, recorder) as (engine, handle):
        yield engine, recorder, handle


def _breaks_grammar(grammar, ids: list[int]) -> list[int]:
    """The ids the grammar forbade where they were generated (none: the stream is clean)."""
    state, bad = grammar.initial(), []
    for token in ids:
        if not grammar.rules[state[0]].allows(token):
            bad.append(token)
            break  # the state machine cannot follow a forbidden id
        state = grammar.advance(state, token)
    return bad


@pytest.mark.parametrize("penalty", [MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY])
async def test_extreme_penalties_in_range_still_follow_the_grammar(served, penalty):
    engine, rec, _ = served
    rec.outputs.clear()
    rec.grammars.clear()
    pcm = b"".join(
        [c.pcm async for c in engine.stream("Hello there, how are you?", repetition_penalty=penalty,
                                            seed=1, request_id="extreme")]
    )  # fmt: skip
    assert pcm
    for rid, out in rec.outputs.items():
        assert out and rec.grammars[rid] is not None
        assert not _breaks_grammar(rec.grammars[rid], out), (rid, out[:20])


@pytest.mark.parametrize("penalty", [1e-300, 1e-46, 1e300, 1e10])
async def test_penalties_past_the_range_are_bad_options_over_the_websocket(served, penalty):
    """The report's request: before, 1e-300 ended in ``generation_failed`` after 65 ids that
    are not codec tokens; 1e-46 (0 in float32) too. Now ``bad_options``, naming the range."""
    _, rec, server = served
    rec.outputs.clear()
    async with RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "p", "text": "Hello there, how are you?",
                           "options": {"repetition_penalty": penalty, "seed": 1}})  # fmt: skip
        _, error = await client.until_end("p")
    assert error.type == "error" and error.code == "bad_options", error
    assert "repetition_penalty" in error.message and "[1e-09, 1e+09]" in error.message
    assert not rec.outputs  # refused before any generation
