"""Interruption truth: after a barge-in, does the bot's context hold what the caller heard?

A real Pipecat pipeline (VeenaTTSService on the real engine, an output that plays in real time
like a sound card, Pipecat's own ``LLMAssistantAggregator``) speaks one LLM turn and is
interrupted at a random moment. The context's last assistant message must hold the words whose
audio had played, within one word, and never a word that had not started playing. ``words``:
the service's word timestamps; ``sentences``: one TTSTextFrame per sentence after its audio
(``push_text_frames=True``, the service before word timings), judged against the same words.
Uses the spark-tiny demo checkpoint (its speech is not real speech: the words' places are the
engine's own estimates on its audio, which is what the pipeline must honour).
"""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

from benchmarks._report import cli, update_section
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.service import VeenaTTSService

ENGLISH = (
    "Hello, thanks for calling the bank. Your OTP is 4821 and it expires in 10 minutes. "
    "Please do not share it with anyone."
)
HINDI = (
    "नमस्ते, कॉल करने के लिए धन्यवाद। आपका बिल ₹1,250 है और आखिरी तारीख 15 मार्च है। कृपया समय पर भुगतान करें।"
)
MIXED = "आपका OTP 4821 है, please इसे share मत करना। Your EMI of ₹3,400 is due on Monday."
TEXTS = {"en": ENGLISH, "hi": HINDI, "mixed": MIXED}
#: Slack for "had started playing": one transport frame (the output writes 40 ms at a time).
SLACK_S = 0.04
#: Played this far into a sentence, some of its words are in the context (about 3 words).
INTO_SENTENCE_S = 1.0


class SoundCard(BaseOutputTransport):
    """An output that plays like a sound card (16 kHz).

    A write returns once the audio before it has played, so the audio it took is the audio the
    caller heard (``played`` seconds).
    """

    def __init__(self) -> None:
        super().__init__(
            TransportParams(
                audio_out_enabled=True, audio_out_sample_rate=16000, audio_out_end_silence_secs=0
            )
        )
        self.played = 0.0
        self.playing = asyncio.Event()  # set at the first audio
        self._free_at = 0.0

    async def start(self, frame: StartFrame) -> None:
        """Start, and report the transport ready."""
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        """Take a frame once the audio before it has played."""
        now = time.monotonic()
        await asyncio.sleep(max(0.0, self._free_at - now))
        seconds = len(frame.audio) / (2 * frame.sample_rate)
        self._free_at = max(now, self._free_at) + seconds
        self.played += seconds
        self.playing.set()
        return True


@dataclass
class Spoken:
    """What the engine said in one turn.

    Attributes:
        seconds: the turn's audio so far.
        words: each word with its start in the turn's audio (from the engine's timings).
        sentences: each text the service spoke (a sentence) with its start and end there.
        cut: the sentences the engine cut short (``AudioChunk.cut``: its loop guard or token
            cap stopped a model that did not end them), by index, with how many of their words
            it timed (those of the parts before the cut).
    """

    seconds: float = 0.0
    words: list[tuple[str, float]] = field(default_factory=list)
    sentences: list[tuple[str, float, float]] = field(default_factory=list)
    cut: dict[int, int] = field(default_factory=dict)


class RecordingEngine:
    """An engine that records every chunk's words at their place in the turn's audio."""

    def __init__(self, engine: SpeechEngine) -> None:
        self._engine = engine
        self.spoken = Spoken()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def stream(self, text: str, voice: str | None = None, **kwargs: Any):
        """The engine's stream, recorded."""
        offset, index, timed, cut = self.spoken.seconds, len(self.spoken.sentences), 0, False
        async with aclosing(self._engine.stream(text, voice, **kwargs)) as chunks:
            self.spoken.sentences.append((text, offset, float("inf")))  # until it ends
            async for chunk in chunks:
                self.spoken.seconds += chunk.duration
                words = getattr(chunk, "words", ())
                self.spoken.words += [(w.word, offset + w.start) for w in words]
                timed += len(words)
                cut = cut or bool(getattr(chunk, "cut", None))
                yield chunk
        self.spoken.sentences[index] = (text, offset, self.spoken.seconds)
        if cut:
            self.spoken.cut[index] = timed


async def interrupted_turn(
    engine: SpeechEngine, text: str, interrupt_at: float | None, **service: Any
) -> tuple[list[str], Spoken, float]:
    """Speak ``text`` as one LLM turn, interrupted ``interrupt_at`` seconds into its audio.

    Returns:
        The words of the context's last assistant message, what the engine said, and the
        seconds of audio that played.
    """
    recorder = RecordingEngine(engine)
    card = SoundCard()
    context = LLMContext()
    tts = VeenaTTSService(recorder, seed=7, **({"word_timestamps": True} | service))
    assistant = LLMAssistantAggregator(context)
    turn_over = asyncio.Event()

    @assistant.event_handler("on_assistant_turn_stopped")
    async def _turn_over(*args: Any) -> None:
        turn_over.set()

    worker = PipelineWorker(
        Pipeline([tts, card, assistant]),
        cancel_on_idle_timeout=False,
        params=PipelineParams(audio_out_sample_rate=16000),
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Any) -> None:
        started.set()

    async def speak() -> None:
        await asyncio.wait_for(started.wait(), timeout=30)
        await worker.queue_frame(LLMFullResponseStartFrame())
        for piece in text.split(" "):  # tokens, as an LLM's
            await worker.queue_frame(LLMTextFrame(piece + " "))
        await worker.queue_frame(LLMFullResponseEndFrame())
        if interrupt_at is not None:
            await asyncio.wait_for(card.playing.wait(), timeout=120)
            await asyncio.sleep(interrupt_at)
            await worker.queue_frame(InterruptionFrame())
            await asyncio.sleep(0.5)
        else:
            await asyncio.wait_for(turn_over.wait(), timeout=300)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), speak())
    messages = [m for m in context.get_messages() if m.get("role") == "assistant"]
    said = messages[-1]["content"].split() if messages else []
    return said, recorder.spoken, card.played


def kept_words(text: str, spoken: Spoken) -> list[str]:
    """The text's words without those the engine did not time in sentences it cut short."""
    words, kept, at = text.split(), [], 0
    for index, (sentence, _, _) in enumerate(spoken.sentences):
        count = len(sentence.split())
        kept += words[at : at + min(spoken.cut.get(index, count), count)]
        at += count
    return kept + words[at:]


def judge(
    said: list[str], text: str, spoken: Spoken, played: float, *, strict: bool = True
) -> str | None:
    """None when the context holds the played words (within one word); else what is wrong.

    A word counts as heard once its start played two transport frames (``2 * SLACK_S``)
    before the interruption (the frame still playing, and one of the transport's clock: words
    the engine placed closer together than that, as when it fits a sentence's last words into
    the audio left, are one moment); none may be in the context that had not started playing
    (``SLACK_S`` of slack). Whatever the timings: every sentence that played
    whole is in the context, and one that played ``INTO_SENTENCE_S`` seconds is in part;
    unless ``strict`` is False, only where the engine had finished that sentence's audio (its
    words are known once its audio is complete: on a machine slower than real time the
    sentence playing may still be generating). Of a sentence the engine cut short
    (``Spoken.cut``) only the words it timed count: the rest are neither required nor allowed.
    """
    kept = kept_words(text, spoken)
    if said != kept[: len(said)]:
        return f"context {said} is not a prefix of the text's words {kept}"
    before = 0  # words of the sentences before
    for index, (sentence, start, end) in enumerate(spoken.sentences):
        if index in spoken.cut:
            before += spoken.cut[index]
            continue
        if end <= played and len(said) < before + len(sentence.split()):
            return f"{len(said)} words in context: sentence {sentence!r} played whole"
        finished = strict or end < float("inf")
        if finished and start + INTO_SENTENCE_S <= played < end and len(said) <= before:
            return f"{len(said)} words in context: {played - start:.1f} s of {sentence!r} played"
        before += len(sentence.split())
    # ``played`` counts the frame the card took last (still playing), and the transport releases
    # a word by its own clock, a frame apart: two frames before ``played`` were surely heard.
    heard = sum(1 for _, start in spoken.words if start < played - 2 * SLACK_S)
    started = sum(1 for _, start in spoken.words if start < played + SLACK_S)
    if len(said) > started:
        return f"{len(said)} words in context, only {started} had started playing"
    if len(said) < heard - 1:
        near = [(w, round(start, 3)) for w, start in spoken.words[len(said) : heard]]
        return f"{len(said)} words in context, {heard} had played ({near} missing)"
    return None


async def measure(engine: SpeechEngine, moments: int, seed: int = 0, **service: Any) -> dict:
    """Interrupt ``moments`` turns (the three texts in turn) at random moments; count truths."""
    rng = random.Random(seed)
    right, problems = 0, []
    for i in range(moments):
        name = list(TEXTS)[i % len(TEXTS)]
        at = rng.uniform(0.1, 5.0)
        said, spoken, played = await interrupted_turn(engine, TEXTS[name], at, **service)
        problem = judge(said, TEXTS[name], spoken, played)
        right += problem is None
        if problem:
            problems.append(f"{name} at {at:.2f} s ({played:.2f} s played): {problem}")
    return {"right": right, "moments": moments, "problems": problems}


async def _run(moments: int) -> dict[str, dict]:
    from pipecat_veena.demo import build_demo_checkpoint
    from pipecat_veena.engine import EngineConfig, VeenaEngine

    engine = VeenaEngine(EngineConfig(checkpoint=build_demo_checkpoint("spark-tiny")))
    await engine.start()
    try:
        return {
            "words": await measure(engine, moments),
            "sentences": await measure(engine, moments, push_text_frames=True),
        }
    finally:
        await engine.shutdown()


def main(write: bool, moments: int = 50) -> str:
    """Measure both ways; returns (and writes) the report's Markdown."""
    results = asyncio.run(_run(moments))
    rows = ["| TTSTextFrames | right | problems (first 3) |", "|---|---|---|"]
    for mode, r in results.items():
        shown = "; ".join(r["problems"][:3]) or "none"
        rows.append(f"| {mode} | **{r['right']} of {r['moments']}** | {shown} |")
    body = "\n".join(rows) + (
        "\n\nRight (strict): the context's last assistant message holds the words whose audio had "
        f"played (its start two {SLACK_S * 1000:.0f} ms transport frames before the "
        "interruption), within one "
        "word, and no word that had not started playing. `words`: this "
        "service (word timestamps); `sentences`: one frame per sentence after its audio, as "
        "before (the interrupted sentence is lost). English, Hindi and mixed turns with numbers "
        "in turn, interrupted 0.1-5 s into the turn's audio, spark-tiny demo checkpoint on CPU. "
        "Words come while their sentence generates (provisional words, released once the audio "
        "past their estimated end exists): where generation runs slower than real time (a loaded "
        "CPU), the words of the sentence playing can arrive after their audio played (the "
        "misses of `words`)."
    )
    if write:
        update_section(
            "interruption",
            "Interruption truth: what the caller heard",
            "python -m benchmarks.interruption",
            body,
        )
    return body


if __name__ == "__main__":
    cli(__doc__, main)
