"""Simulated phone calls for benchmarks/load.py: a caller, a bot's sentences, a real-time player.

Each call is one RemoteVeenaEngine (its own WebSocket, as one bot process or pipeline has): the
caller talks (a random pause), the bot speaks a sentence, the audio is played in real time, and
sometimes the caller barges in and the bot's utterance is cancelled mid-playback. The player
measures the longest stall after playback started (an underrun: a gap on the phone).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from pipecat_veena.remote import RemoteVeenaEngine

#: What a phone agent says: Hindi, English and both, with numbers and codes the normaliser reads.
SENTENCES = (
    "नमस्ते! आपका order आज शाम तक deliver हो जाएगा।",
    "Your appointment is confirmed for Monday at ten in the morning.",
    "Kya aap apna account number bata sakte hain, please?",
    "मैं आपकी और क्या मदद कर सकती हूँ? Thank you for calling.",
    "Your bill of ₹1,499 is due on the 15th of this month.",
    "आपका OTP 482913 है, इसे किसी के साथ share न करें।",
    "I have booked a table for four at eight thirty tonight.",
    "कृपया लाइन पर बने रहें, मैं आपकी details check कर रही हूँ।",
    "The refund of two thousand rupees will reach your account in three to five days.",
    "क्या मैं आपको किसी और चीज़ में मदद कर सकती हूँ?",
)
#: A phone player's typical jitter buffer: underruns are also measured behind one this deep.
JITTER_BUFFER_S = 0.2


@dataclass(frozen=True)
class CallPlan:
    """How the simulated calls behave.

    Parameters:
        pause_s: the caller's turn between two bot sentences, uniform in this range (seconds).
        barge_in: the share of bot sentences the caller interrupts.
        barge_in_after_s: when the caller interrupts, seconds after the first audio (uniform).
        prebuffer_s: audio the player holds before it starts playing (a jitter buffer).
        hang_s: an utterance still open after this long counts as hung (and is closed); also
            the engine's ``response_timeout_s`` (a slow server is measured, not failed).
        voice: the voice (None: the server's default).
    """

    pause_s: tuple[float, float] = (0.5, 2.5)
    barge_in: float = 0.2
    barge_in_after_s: tuple[float, float] = (0.3, 2.0)
    prebuffer_s: float = 0.0
    hang_s: float = 120.0
    voice: str | None = None


@dataclass
class Utterance:
    """One bot sentence as the caller got it.

    Parameters:
        call: the call's index.
        outcome: completed, cancelled (barge-in), error, or hung.
        ttfa_s: from asking to the first audio (None: none came).
        audio_s: audio received (seconds).
        elapsed_s: from asking to the last audio or the end.
        underrun_s: the longest stall of playback after it started.
        buffered_underrun_s: the same behind a ``JITTER_BUFFER_S`` jitter buffer.
        error: the error's type and message, for errors.
        replayed: its audio restarted (the LLM token count of a chunk went down): a retry
            after the first audio, which would repeat words; must never happen.
    """

    call: int
    outcome: str
    ttfa_s: float | None = None
    audio_s: float = 0.0
    elapsed_s: float = 0.0
    underrun_s: float = 0.0
    buffered_underrun_s: float = 0.0
    error: str | None = None
    replayed: bool = False


@dataclass
class CallResult:
    """A call's utterances and its engine's counters (retries, connections)."""

    call: int
    utterances: list[Utterance] = field(default_factory=list)
    retries: int = 0
    connects: int = 0
    start_error: str | None = None


def longest_underrun(arrivals: Sequence[tuple[float, float]], prebuffer_s: float = 0.0) -> float:
    """The longest stall of a real-time player fed these chunks.

    Playback starts ``prebuffer_s`` after the first chunk arrives and plays each chunk's audio
    in order at real time; a chunk that arrives after the audio before it has run out stalls
    playback until it arrives (then it plays on from there).

    Args:
        arrivals: (arrival time in seconds, audio duration in seconds) per chunk, in order.
        prebuffer_s: how long the player waits after the first chunk before playing.

    Returns:
        The longest stall in seconds (0.0 when playback never starved).
    """
    if not arrivals:
        return 0.0
    runs_out = arrivals[0][0] + prebuffer_s
    longest = 0.0
    for arrived, duration in arrivals:
        if arrived > runs_out:
            longest = max(longest, arrived - runs_out)
            runs_out = arrived
        runs_out += duration
    return longest


async def speak(
    engine: RemoteVeenaEngine, text: str, plan: CallPlan, rng: random.Random, call: int
) -> tuple[Utterance, float]:
    """Speak one sentence and play it; returns it and when its playback ends (monotonic)."""
    rate = engine.sample_rate
    barge = rng.uniform(*plan.barge_in_after_s) if rng.random() < plan.barge_in else None
    arrivals: list[tuple[float, float]] = []
    start = time.monotonic()
    outcome, error = "completed", None
    tokens, replayed = 0, False
    try:
        async with asyncio.timeout(plan.hang_s):
            stream = engine.stream(text, plan.voice, seed=rng.randrange(1 << 30))
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    now = time.monotonic()
                    arrivals.append((now, len(chunk.pcm) / 2 / rate))
                    replayed |= chunk.tokens < tokens
                    tokens = chunk.tokens
                    if barge is not None and now - arrivals[0][0] >= barge:
                        outcome = "cancelled"  # closing the stream cancels it on the server
                        break
    except TimeoutError:
        outcome = "hung"
    except Exception as e:
        outcome, error = "error", f"{type(e).__name__}: {e}"
    end = time.monotonic()
    audio = sum(d for _, d in arrivals)
    utterance = Utterance(
        call=call,
        outcome=outcome,
        ttfa_s=arrivals[0][0] - start if arrivals else None,
        audio_s=audio,
        elapsed_s=(arrivals[-1][0] if arrivals else end) - start,
        underrun_s=longest_underrun(arrivals, plan.prebuffer_s),
        buffered_underrun_s=longest_underrun(arrivals, max(plan.prebuffer_s, JITTER_BUFFER_S)),
        error=error,
        replayed=replayed,
    )
    playback_end = end if not arrivals or outcome == "cancelled" else _runs_out(arrivals, plan)
    return utterance, playback_end


def _runs_out(arrivals: list[tuple[float, float]], plan: CallPlan) -> float:
    runs_out = arrivals[0][0] + plan.prebuffer_s
    for arrived, duration in arrivals:
        runs_out = max(runs_out, arrived) + duration
    return runs_out


class Deadline:
    """When the calls end (monotonic seconds); a fault may bring it forward."""

    def __init__(self, at: float) -> None:
        self.at = at

    def left(self) -> float:
        return self.at - time.monotonic()


async def run_call(
    url: str,
    call: int,
    deadline: Deadline,
    plan: CallPlan,
    *,
    seed: int,
    api_key: str | None = None,
    done: list[Utterance] | None = None,
) -> CallResult:
    """One call until ``deadline``: caller pauses, bot sentences, barge-ins.

    ``done`` (shared) receives each utterance as it ends, for a live progress display.
    """
    rng = random.Random(seed)
    result = CallResult(call)
    engine = RemoteVeenaEngine(
        url, api_key=api_key, connect_timeout_s=30.0, response_timeout_s=plan.hang_s
    )
    try:
        await asyncio.sleep(rng.uniform(0, min(2.0, max(0.0, deadline.left()) / 4)))
        await engine.start()
        while deadline.left() > 0:
            await asyncio.sleep(rng.uniform(*plan.pause_s))  # the caller's turn
            if deadline.left() <= 0:
                break
            utterance, playback_end = await speak(engine, rng.choice(SENTENCES), plan, rng, call)
            result.utterances.append(utterance)
            if done is not None:
                done.append(utterance)
            await asyncio.sleep(max(0.0, playback_end - time.monotonic()))  # the caller listens
    except Exception as e:  # the call could not even start (no server reachable)
        result.start_error = f"{type(e).__name__}: {e}"
    finally:
        stats = engine.stats()
        result.retries, result.connects = stats["retries"], stats["connects"]
        await engine.shutdown()
    return result
