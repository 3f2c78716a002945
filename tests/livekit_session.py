"""What a LiveKit ``AgentSession`` needs to run without a room, for tests.

``AgentSession.start(agent)`` without ``room`` creates no RoomIO: the session speaks into whatever
``session.output.audio`` is set. RoomIO puts LiveKit's ``TranscriptSynchronizer`` between the
session and the room's audio track; tests do the same over ``RealtimeSpeaker``, a sink that plays
in real time, so the synchronizer releases the agent's words as their audio plays and reports the
words played when the caller interrupts (what ``use_tts_aligned_transcript`` is for).
``FixedLLM`` answers every turn with a fixed text, streamed in small pieces as an LLM would.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from livekit import rtc
from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions, llm, utils
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, TimedString
from livekit.agents.voice import Agent, ModelSettings, io


class FixedLLM(llm.LLM):
    """An LLM whose every answer is ``answer``, a few characters per chunk."""

    def __init__(self, answer: str) -> None:
        super().__init__()
        self.answer = answer

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        **_: Any,
    ) -> llm.LLMStream:
        return _FixedStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _FixedStream(llm.LLMStream):
    async def _run(self) -> None:
        answer = self._llm.answer
        request_id = utils.shortuuid()
        for i in range(0, len(answer), 7):
            delta = llm.ChoiceDelta(role="assistant", content=answer[i : i + 7])
            self._event_ch.send_nowait(llm.ChatChunk(id=request_id, delta=delta))
            await asyncio.sleep(0)


class RealtimeSpeaker(io.AudioOutput):
    """An audio sink that plays each segment in real time, from when it is all captured.

    Starting at the end of the capture is a jitter buffer deep enough never to run dry, so the
    audio played at any instant is the wall time since playback started (what LiveKit's
    synchronizer assumes when it paces words). ``clear_buffer()`` (an interruption) stops at
    once and reports how far it got; ``positions`` keeps each segment's played seconds.
    """

    def __init__(self) -> None:
        super().__init__(label="RealtimeSpeaker", capabilities=io.AudioOutputCapabilities(False))
        self.captured = 0.0
        self.started_at: float | None = None
        self.playing = asyncio.Event()
        self.positions: list[float] = []
        self._end: asyncio.TimerHandle | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self.captured += frame.duration

    def flush(self) -> None:
        super().flush()
        if not self.captured or self.started_at is not None:
            return
        self.started_at = time.time()
        self.on_playback_started(created_at=self.started_at)
        self.playing.set()
        self._end = asyncio.get_running_loop().call_later(self.captured, self._finish, False)

    def clear_buffer(self) -> None:
        if self.captured:
            self._finish(interrupted=True)

    def _finish(self, interrupted: bool) -> None:
        position = self.captured
        if interrupted:
            elapsed = 0.0 if self.started_at is None else time.time() - self.started_at
            position = min(position, elapsed)
        if self._end is not None:
            self._end.cancel()
        self.captured, self.started_at, self._end = 0.0, None, None
        self.playing.clear()
        self.positions.append(position)
        self.on_playback_finished(playback_position=position, interrupted=interrupted)


class TimedAgent(Agent):
    """An agent that keeps the TimedStrings its TTS attached to the audio of each reply."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timed: list[TimedString] = []

    async def tts_node(self, text, model_settings: ModelSettings):  # noqa: ANN001, ANN201
        """LiveKit's own TTS node; each frame's timed words are recorded on the way."""
        self.timed = []
        async for frame in Agent.default.tts_node(self, text, model_settings):
            self.timed.extend(frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []))
            yield frame
