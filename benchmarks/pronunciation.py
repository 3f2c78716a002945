"""Pronunciation control: the text the engine gives the model per case, break lengths measured in
the real engine's audio, and how fast hostile markup is refused.

The cases (Hindi, English, code-mixed; names, acronyms, digits, dates, phone numbers) go through
``normalize.ssml.speech_parts``, the one function the engine builds its prompts with; the breaks
are spoken by the real vLLM CPU engine on the demo Spark checkpoint (toy LLM, random codec: it
makes sound, not words) and measured as the longest run of samples no louder than 2 (int16),
at the codec's 16 kHz and after the stream resampler to 24 and 48 kHz.

    .venv/bin/python -m benchmarks.pronunciation [--no-write]
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from benchmarks._report import cli, update_section
from pipecat_veena.normalize import Lexicon
from pipecat_veena.normalize.lexicon import request_lexicon
from pipecat_veena.normalize.ssml import SsmlError, model_text, parse_ssml, speech_parts

SERVER_LEXICON = {"en": {"EMI": "E M I"}, "hi": {"EMI": "ई एम आई"}, "Zomato": "ज़ोमैटो"}

#: (case, request: ssml document or text, ssml?, request lexicon or None, language)
CASES = [
    ("en, name (lexicon)", "Please hold, Ms. Nguyen.", False, {"Nguyen": "Ngwin"}, "auto"),
    (
        "en, name (phoneme)",
        'Ask <phoneme alphabet="ipa" ph="ˈʃɔːn">Sean</phoneme>.',
        True,
        None,
        "auto",
    ),
    (
        "en, acronym (sub)",
        'The <sub alias="World Health Organisation">WHO</sub> said so.',
        True,
        None,
        "auto",
    ),
    ("en, acronym (server lexicon)", "Your EMI is due.", False, None, "auto"),
    (
        "en, acronym (request over server)",
        "Your EMI is due.",
        False,
        {"EMI": "monthly instalment"},
        "auto",
    ),
    ("en, spell", 'Code <say-as interpret-as="characters">SBI4</say-as>.', True, None, "auto"),
    ("en, digits", 'PIN <say-as interpret-as="digits">2024</say-as>.', True, None, "auto"),
    (
        "en, cardinal",
        'About <say-as interpret-as="cardinal">2024</say-as> people.',
        True,
        None,
        "auto",
    ),
    ("en, date", 'Due <say-as interpret-as="date">05/08/2025</say-as>.', True, None, "auto"),
    ("en, phone", 'Call <say-as interpret-as="telephone">9876543210</say-as>.', True, None, "auto"),
    ("en, break", 'Yes.<break time="300ms"/>Go ahead.', True, None, "auto"),
    (
        "hi, name (phoneme)",
        'नमस्ते <phoneme alphabet="ipa" ph="kəməleːʃ">कमलेश</phoneme> जी।',
        True,
        None,
        "auto",
    ),
    ("hi, brand (server lexicon)", "Zomato से order आया।", False, None, "auto"),
    ("hi, ordinal", 'यह <say-as interpret-as="ordinal">3</say-as> बार है।', True, None, "hi"),
    ("hi, date", 'तारीख <say-as interpret-as="date">05/08/2025</say-as> है।', True, None, "hi"),
    ("hi, phone", 'नंबर <say-as interpret-as="telephone">98765 43210</say-as> है।', True, None, "hi"),
    ("hi, currency", 'बिल <say-as interpret-as="currency">₹1,250</say-as> है।', True, None, "hi"),
    ("mixed, lang", 'Your total is <lang xml:lang="hi">₹500</lang>, thanks.', True, None, "auto"),
    ("mixed, acronym", "आपकी EMI ₹1,250 है।", False, {"hi": {"EMI": "किस्त"}}, "auto"),
    (
        "mixed, break",
        'आपका order ship हो गया।<break strength="strong"/>Thank you!',
        True,
        None,
        "auto",
    ),
]

BREAKS_MS = (100, 300, 750, 1000, 2500)
QUIET = 2


def _said(text: str, ssml: bool, lexicon: dict | None, language: str) -> str:
    lex = Lexicon(SERVER_LEXICON)
    if lexicon is not None:
        lex = lex.merged(request_lexicon(lexicon))
    return model_text(speech_parts(text, language, lexicon=lex, ssml=ssml)).replace("\n", " ⏎ ")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def case_table() -> list[str]:
    lines = [
        "| case | request | lexicon | the model reads |",
        "|---|---|---|---|",
    ]
    for name, text, ssml, lexicon, language in CASES:
        request = f"`{_cell(text)}`" + (" (ssml)" if ssml else "")
        lex = f"`{_cell(str(lexicon))}`" if lexicon else "server's"
        said = _cell(_said(text, ssml, lexicon, language))
        lines.append(f"| {name} | {request} | {lex} | {said} |")
    return lines


def _timed_refusal(action) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        action()
    except (SsmlError, ValueError) as e:
        return (time.perf_counter() - started) * 1000, str(e).split(": ", 1)[-1][:70]
    raise AssertionError("not refused")


def hostile_table() -> list[str]:
    huge = {f"t{i}": f"s{i}" for i in range(1_000_000)}  # (built before the clock starts)
    attacks = [
        ("1 MB document", lambda: parse_ssml("<speak>" + "a" * 1_000_000 + "</speak>")),
        ("10,000-deep nesting", lambda: parse_ssml("<s>" * 10_000 + "x" + "</s>" * 10_000)),
        (
            "entity expansion (billion laughs)",
            lambda: parse_ssml(
                '<!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]><speak>&b;</speak>'
            ),
        ),
        ("undeclared entity", lambda: parse_ssml("<speak>&xxe;</speak>")),
        ("1,000,000-entry lexicon", lambda: request_lexicon(huge)),
        ("entry containing its own term", lambda: request_lexicon({"IIT": "IIT Bombay"})),
    ]
    lines = ["| hostile input | refused in | error |", "|---|---|---|"]
    for name, action in attacks:
        ms, message = _timed_refusal(action)
        lines.append(f"| {name} | {ms:.2f} ms | {_cell(message)} |")
    lines.append("")
    lines.append(
        "(The 1,000,000-entry lexicon's time excludes building the dict; counting stops at "
        "entry 1001. Over HTTP the body and text caps refuse the large ones first: 413/400.)"
    )
    return lines


def _longest_quiet(pcm: np.ndarray) -> int:
    quiet = np.abs(pcm.astype(np.int32)) <= QUIET
    if not quiet.any():
        return 0
    edges = np.diff(np.concatenate(([0], quiet.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max())


async def break_table() -> list[str]:
    from pipecat_veena.demo import build_demo_checkpoint
    from pipecat_veena.engine import EngineConfig, VeenaEngine
    from pipecat_veena.resample import StreamResampler

    engine = VeenaEngine(EngineConfig(checkpoint=build_demo_checkpoint("spark-tiny"), warmup=False))
    await engine.start()
    lines = [
        "| break asked | measured at 16 kHz | error | at 24 kHz | error | at 48 kHz | error |",
        "|---|---|---|---|---|---|---|",
    ]
    try:
        for ms in BREAKS_MS:
            doc = f'Hello there.<break time="{ms}ms"/>And goodbye.'
            chunks = [c async for c in engine.stream(doc, ssml=True, seed=3)]
            row = [f"{ms} ms"]
            for rate in (engine.sample_rate, 24000, 48000):
                if rate == engine.sample_rate:
                    pcm = b"".join(c.pcm for c in chunks)
                else:
                    resampler = StreamResampler(engine.sample_rate, rate)
                    pcm = b"".join(resampler.resample(c.pcm) for c in chunks) + resampler.flush()
                got = _longest_quiet(np.frombuffer(pcm, dtype="<i2")) / rate * 1000
                row += [f"{got:.1f} ms", f"{got - ms:+.1f} ms"]
            lines.append("| " + " | ".join(row) + " |")
        doc = 'One two.<break time="400ms"/>Three four.'
        for speed in (0.5, 1.5, 2.0):
            chunks = [c async for c in engine.stream(doc, ssml=True, seed=3, speed=speed)]
            pcm = np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2")
            got = _longest_quiet(pcm) / engine.sample_rate * 1000
            row = f"| 400 ms at speed {speed} | {got:.1f} ms | {got - 400:+.1f} ms |"
            lines.append(row + " | | | |")
        rates = await rate_rows(engine)
    finally:
        await engine.shutdown()
    lines += [
        "",
        "A break is exact zeros at the codec's rate (the decoder is flushed before it, a new one "
        "starts after); after resampling, the filter's ringing at both edges eats a little of it "
        "and the quiet ends of the words around it may add some (within 10 ms is the target). "
        "At a request speed a break passes around the stretcher (flushed before it, started "
        "afresh after it); what is left is the stretched words' quiet edges.",
        "",
        "`<prosody rate>` on the second sentence of `Good morning to you. <prosody rate=R>And a "
        "good day after it.</prosody>` (same seed, so the same tokens; the first sentence, "
        "spoken alone with the same seed, is the same audio, so the span's stretched length is "
        "the total minus it):",
        "",
        *rates,
    ]
    return lines


async def rate_rows(engine) -> list[str]:
    doc = 'Good morning to you. <prosody rate="{}">And a good day after it.</prosody>'
    lengths = {}
    for rate in (0.5, 1.0, 1.5, 2.0):
        chunks = [c async for c in engine.stream(doc.format(rate), ssml=True, seed=8)]
        lengths[rate] = sum(c.num_samples for c in chunks) / engine.sample_rate
    alone = [c async for c in engine.stream("Good morning to you.", ssml=True, seed=8)]
    first = sum(c.num_samples for c in alone) / engine.sample_rate  # (the same first prompt)
    span = lengths[1.0] - first
    lines = ["| rate | total | span | span x rate / span at 1.0 |", "|---|---|---|---|"]
    for rate, total in lengths.items():
        got = total - first
        lines.append(f"| {rate} | {total:.3f} s | {got:.3f} s | {got * rate / span:.3f} |")
    return lines


def main(write: bool) -> str:
    body = [
        "Per case, what the model is given (`pipecat-veena normalize` prints the same; the server "
        f"lexicon is `{SERVER_LEXICON}`; ⏎ separates prompts, a break is `[pause N ms]`):",
        "",
        *case_table(),
        "",
        "Breaks in the real engine's audio (vLLM CPU, demo spark-tiny):",
        "",
        *asyncio.run(break_table()),
        "",
        "Hostile input, refused before any work:",
        "",
        *hostile_table(),
    ]
    text = "\n".join(body) + "\n"
    if write:
        update_section(
            "pronunciation",
            "Pronunciation: per-request lexicon, SSML, breaks",
            ".venv/bin/python -m benchmarks.pronunciation",
            text,
        )
    return text


if __name__ == "__main__":
    cli(__doc__, main)
