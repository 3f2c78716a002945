"""VeenaTTS (LiveKit plugin) through the real parts: the vLLM CPU engine on the demo Spark
checkpoint and the torch BiCodec (tiny config), with LiveKit's own TTS base classes (no server).

``RecordingGenerator`` (tests/recording.py) passes every call through to the session's real
VllmGenerator and keeps the generated ids per request, so audio length can be checked against
the tokens that made it (the engine's request ids start with the LiveKit request id of the
attempt that made the frames). The demo model sometimes breaks the codec grammar; LiveKit then
retries, so an error event is allowed if it was recoverable and the audio came from the retry.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from livekit_session import FixedLLM, RealtimeSpeaker, TimedAgent
from recording import RecordingGenerator

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.livekit import VeenaTTS

pytestmark = pytest.mark.vllm

LONG_TEXT = "This answer keeps going on and on, so that generation takes a good while. " * 3


@pytest_asyncio.fixture(scope="session")
async def livekit_engine(spark_tiny_checkpoint, spark_generator):
    """A real VeenaEngine over the session's vLLM generator (no second vLLM engine)."""
    counter = RecordingGenerator(spark_generator)
    config = EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False, max_model_len=2048)
    engine = VeenaEngine(config, generator=counter)
    await engine.start()
    yield engine, counter
    await engine.shutdown()


def _semantic_samples(engine: VeenaEngine, ids: list[int]) -> int:
    """Samples the codec makes from the semantic tokens among ``ids`` (one frame each)."""
    b = engine._format.ids
    semantics = sum(1 for t in ids if 0 <= t - b.semantic_base < b.num_semantic_codes)
    return semantics * engine._codec.samples_per_frame


class Events:
    """Collects a TTS's ``error`` and ``metrics_collected`` events."""

    def __init__(self, tts):
        self.errors, self.metrics = [], []
        self.measured = asyncio.Event()
        tts.on("error", self.errors.append)
        tts.on("metrics_collected", self._metrics)

    def _metrics(self, metrics) -> None:
        self.metrics.append(metrics)
        self.measured.set()

    async def settle(self) -> None:
        """Wait for the metrics event (LiveKit's monitor task emits it after the audio)."""
        async with asyncio.timeout(10):
            await self.measured.wait()


async def test_synthesize_collect_rate_length_and_metrics(livekit_engine):
    engine, counter = livekit_engine
    tts = VeenaTTS(engine, seed=5)
    events = Events(tts)
    text = "Hello there, this is Veena speaking."
    frame = await tts.synthesize(text).collect()
    await events.settle()
    (m,) = events.metrics
    tokens = counter.tokens_of(m.request_id)
    assert frame.sample_rate == engine.sample_rate == tts.sample_rate
    assert frame.samples_per_channel == _semantic_samples(engine, tokens) > 0
    assert m.ttfb > 0 and m.audio_duration == pytest.approx(frame.duration, abs=1e-3)
    assert m.characters_count == len(text) and m.output_tokens == len(tokens)
    assert m.metadata.model_name == engine.model_name
    assert m.input_tokens > 0 and m.output_tokens == len(tokens)
    assert all(e.recoverable for e in events.errors)
    assert engine.stats()["unfinished_requests"] == 0


async def test_requested_rate_is_resampled_to_the_tokens_duration(livekit_engine):
    engine, counter = livekit_engine
    tts = VeenaTTS(engine, sample_rate=24000, seed=6)
    events = [ev async for ev in tts.synthesize("Namaste, aap kaise hain?")]
    native = _semantic_samples(engine, counter.tokens_of(events[-1].request_id))
    samples = sum(ev.frame.samples_per_channel for ev in events)
    assert {ev.frame.sample_rate for ev in events} == {24000} and native > 0
    assert abs(samples - native * 24000 // engine.sample_rate) <= 2


async def test_stream_speaks_pushed_pieces_as_one_final_segment(livekit_engine):
    engine, counter = livekit_engine
    tts = VeenaTTS(engine, seed=7)
    events = Events(tts)
    pieces = ["The first sentence is here", ". And the", " second one", " follows it now."]
    async with tts.stream() as stream:
        stream.push_text(pieces[0])
        stream.push_text(pieces[1])
        first = await anext(stream)  # the first sentence speaks before the text is complete
        for piece in pieces[2:]:
            stream.push_text(piece)
        stream.flush()
        frames = [first, *[ev async for ev in stream]]
    await events.settle()
    assert frames[-1].is_final and not any(ev.is_final for ev in frames[:-1])
    assert len({ev.segment_id for ev in frames}) == 1 and frames[0].segment_id
    assert {ev.frame.sample_rate for ev in frames} == {engine.sample_rate}
    final = [ev for ev in frames if ev.request_id == frames[-1].request_id]  # the last attempt
    samples = sum(ev.frame.samples_per_channel for ev in final)
    requests = [rid for rid in counter.outputs if rid.startswith(f"{frames[-1].request_id}-")]
    assert samples == _semantic_samples(engine, counter.tokens_of(frames[-1].request_id)) > 0
    assert len(requests) >= 2  # one engine request per sentence
    (m,) = events.metrics
    assert m.streamed and m.ttfb > 0 and m.characters_count == len("".join(pieces))
    assert m.audio_duration == pytest.approx(samples / engine.sample_rate, abs=1e-3)
    assert all(e.recoverable for e in events.errors)


@pytest.mark.parametrize("streamed", [False, True])
async def test_closing_mid_utterance_leaves_no_unfinished_request(livekit_engine, streamed):
    engine, _ = livekit_engine
    tts = VeenaTTS(engine)
    if streamed:
        stream = tts.stream()
        stream.push_text(LONG_TEXT)
        stream.end_input()
    else:
        stream = tts.synthesize(LONG_TEXT)
    await anext(stream)
    assert engine.stats()["active_streams"] == 1
    await stream.aclose()
    stats = engine.stats()
    assert stats["unfinished_requests"] == 0 and stats["active_streams"] == 0


async def test_stream_carries_each_written_word_timed_behind_its_audio(livekit_engine):
    """Aligned transcript: every written word of every sentence (₹1,250 as one), as a
    TimedString on a frame at or after the end of its audio, times counted from the segment's
    start (cumulative over its sentences)."""
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

    engine, _ = livekit_engine
    tts = VeenaTTS(engine, seed=7)
    assert tts.capabilities.aligned_transcript
    text = "आपका बिल ₹1,250 है। Please pay it by Monday, thank you."
    async with tts.stream() as stream:
        stream.push_text(text)
        stream.flush()
        frames = [ev async for ev in stream]
    final = [ev for ev in frames if ev.request_id == frames[-1].request_id]  # the last attempt
    seconds, timed = 0.0, []
    for ev in final:
        seconds += ev.frame.duration
        for word in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
            # (LiveKit's emitter may leave out a last partial 10 ms frame of the audio)
            assert word.end_time <= seconds + 0.011, f"{word!r} came before its audio"
            timed.append(word)
    assert [w.strip() for w in timed] == text.split()
    starts = [w.start_time for w in timed]
    assert starts == sorted(starts) and all(w.start_time <= w.end_time for w in timed)
    assert timed[-1].end_time > 0.5 * seconds  # the second sentence counts from the segment start


#: How far from the played audio (behind or ahead) LiveKit's synchronizer may release a word (s).
_PACING_SLACK_S = 1.0

REPLIES = {
    "en": "Your OTP is 482913 and it expires in 10 minutes. Please do not share it with anyone, "
    "not even with our own staff.",
    "hi": "आपका बिल ₹1,250 है, कृपया 15 मार्च तक भुगतान करें।",
}


@pytest.mark.parametrize(("language", "moments"), [("en", (0.3, 0.7)), ("hi", (0.5,))])
async def test_agent_session_cuts_an_interrupted_reply_at_the_word_played(
    livekit_engine, language, moments
):
    """LiveKit's AgentSession with use_tts_aligned_transcript=True, its TranscriptSynchronizer
    (what RoomIO puts before the room's track) over a sink that plays in real time, a fixed LLM
    reply spoken by VeenaTTS, interrupted at ``moments`` (fractions of the reply's audio): the
    chat context's assistant message is the reply's first words: every word that had finished
    playing a second before the interruption and none that started a second after it (LiveKit's
    pacing slack), not the whole reply."""
    from livekit.agents import APIConnectOptions
    from livekit.agents.voice import AgentSession
    from livekit.agents.voice.agent_session import SessionConnectOptions
    from livekit.agents.voice.transcription import TranscriptSynchronizer

    engine, _ = livekit_engine
    reply = REPLIES[language]
    speaker = RealtimeSpeaker()
    synchronizer = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=None)
    agent = TimedAgent(instructions="Answer the caller.")
    session = AgentSession(
        llm=FixedLLM(reply),
        tts=VeenaTTS(engine, seed=11),
        use_tts_aligned_transcript=True,
        # a shared, loaded CPU may take longer than LiveKit's default 10 s for first audio
        conn_options=SessionConnectOptions(tts_conn_options=APIConnectOptions(timeout=120)),
    )
    session.output.audio = synchronizer.audio_output
    session.output.transcription = synchronizer.text_output
    await session.start(agent, record=False)
    try:
        for fraction in moments:
            handle = session.generate_reply(user_input="What is my code?")
            async with asyncio.timeout(300):  # the speaker plays a reply once it is whole
                await speaker.playing.wait()
            duration = speaker.captured
            await asyncio.sleep(fraction * duration)
            await session.interrupt()
            async with asyncio.timeout(30):
                await handle
            (played,) = speaker.positions[-1:]
            message = [
                item
                for item in session.history.items
                if item.type == "message" and item.role == "assistant"
            ][-1]
            said = (message.text_content or "").split()
            # LiveKit paces words between the times it is given, one word at a time at the
            # reply's mean syllable rate: it may run behind them (by up to 0.5 s measured here,
            # more on a loaded machine) or ahead of them after a long word (a spelled-out
            # number: 0.6-1 s), so the message must hold every word that had finished playing a
            # second before the interruption, and none that started a second after it
            heard = sum(1 for w in agent.timed if w.end_time <= played - _PACING_SLACK_S)
            started = sum(1 for w in agent.timed if w.start_time < played + _PACING_SLACK_S)
            assert [w.strip() for w in agent.timed] == reply.split()  # every word was timed
            assert message.interrupted and 0 < played < duration
            assert said == reply.split()[: len(said)], said  # the reply's first words
            # ... and no word that was still a second away
            timeline = [(str(w), round(w.start_time, 2)) for w in agent.timed]
            assert heard <= len(said) <= started, (played, said, timeline)
            assert len(said) < len(reply.split())
    finally:
        await session.aclose()
    assert engine.stats()["unfinished_requests"] == 0
