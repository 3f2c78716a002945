"""``RecordingGenerator``: the real generator, with every prompt and generated id kept.

It delegates every call to a real TokenGenerator (the session's vLLM engine, which it never shuts
down) so that tests can compare audio with the tokens that made it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from pipecat_veena.generation import SamplingOptions, TokenDelta, TokenGenerator


class ForwardingGenerator(TokenGenerator):
    """Forwards every call to a real generator; subclasses watch what passes through."""

    def __init__(self, inner: TokenGenerator) -> None:
        self.inner = inner

    async def start(self) -> None:
        await self.inner.start()

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    @property
    def is_running(self) -> bool:
        return self.inner.is_running

    @property
    def was_shut_down(self) -> bool:
        return self.inner.was_shut_down

    def num_unfinished(self) -> int:
        return self.inner.num_unfinished()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        return self.inner.generate(prompt_ids, options, request_id)


class RecordingGenerator(ForwardingGenerator):
    """Delegates to a real generator and records prompts and outputs per request id."""

    def __init__(self, inner: TokenGenerator) -> None:
        super().__init__(inner)
        self.prompts: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = {}

    def tokens_of(self, request_id: str) -> list[int]:
        """Every id generated for the engine requests started with ``request_id``."""
        return [
            t for rid, out in self.outputs.items() if rid.startswith(f"{request_id}-") for t in out
        ]

    async def shutdown(self) -> None:  # the session fixture owns the real engine
        pass

    async def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        self.prompts[request_id] = list(prompt_ids)
        out = self.outputs.setdefault(request_id, [])
        async with aclosing(self.inner.generate(prompt_ids, options, request_id)) as deltas:
            async for delta in deltas:
                out.extend(delta.token_ids)
                yield delta
