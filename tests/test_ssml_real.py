"""SSML and per-request lexicons through the real parts (issue 39 items 2-3): the vLLM CPU engine on
the demo Spark checkpoint (what the model is given: the prompts' text), the real server on a real
socket (OpenAI route with ``ssml`` and ``lexicon`` in the body, as ``extra_body`` sends them; our
WebSocket), and break lengths measured in the output audio."""

from __future__ import annotations

import re

import httpx
import numpy as np
import openai
import pytest
import pytest_asyncio
from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSTextFrame
from pipecat.tests.utils import run_test
from recording import RecordingGenerator
from server_fakes import RawClient, pcm_of
from servers import engine_behind_server

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.engine.formats import load_tokenizer
from pipecat_veena.remote.protocol import ErrorCode
from pipecat_veena.service import VeenaTTSService

pytestmark = pytest.mark.vllm

_CONTENT = re.compile(r"<\|start_content\|>(?:<\|[^<>|]*\|>)*(.*?)<\|end_content\|>", re.S)

DOC = (
    '<speak>Hello <sub alias="World Health Organisation">WHO</sub>.'
    '<break time="300ms"/>Call <say-as interpret-as="telephone">9876543210</say-as> today.'
    "</speak>"
)
SAID = [
    "Hello World Health Organisation.",
    "Call nine eight seven six five, four three two one zero today.",
]
#: A break is measured as the longest run of samples at most this loud (int16).
QUIET = 2


@pytest_asyncio.fixture(scope="module")
async def real(spark_tiny_checkpoint, spark_generator):
    """(engine, recorder, server): one real engine with a server lexicon behind a real server."""
    recorder = RecordingGenerator(spark_generator)
    config = EngineConfig(
        checkpoint=spark_tiny_checkpoint, warmup=False, max_model_len=2048,
        lexicon={"en": {"EMI": "E M I", "Zomato": "Zo mah toe"}},
    )  # fmt: skip
    async with engine_behind_server(config, recorder) as (engine, handle):
        yield engine, recorder, handle


@pytest.fixture(scope="module")
def tokenizer(spark_tiny_checkpoint):
    return load_tokenizer(spark_tiny_checkpoint / "LLM")


def _prompt_texts(recorder: RecordingGenerator, tokenizer, request_id: str) -> list[str]:
    """The text inside each prompt of the engine requests whose id starts with ``request_id``."""
    rids = sorted(
        (r for r in recorder.prompts if r.startswith(f"{request_id}-")),
        key=lambda r: int(r.rsplit("-", 1)[1]),
    )
    texts = []
    for rid in rids:
        decoded = tokenizer.decode(recorder.prompts[rid], skip_special_tokens=False)
        texts.extend(_CONTENT.findall(decoded))
    return texts


def _longest_quiet_s(pcm: np.ndarray, rate: int) -> float:
    """The longest run of samples no louder than QUIET, in seconds."""
    quiet = np.abs(pcm.astype(np.int32)) <= QUIET
    best = run = 0
    for q in quiet:
        run = run + 1 if q else 0
        best = max(best, run)
    return best / rate


async def test_engine_reads_the_markup_and_inserts_exact_silence(real, tokenizer):
    engine, recorder, _ = real
    chunks = [c async for c in engine.stream(DOC, request_id="ssml-e", ssml=True, seed=3)]
    assert _prompt_texts(recorder, tokenizer, "ssml-e") == SAID  # no markup, no digits
    pcm = np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2")
    quiet = _longest_quiet_s(pcm, engine.sample_rate)
    assert 0.3 <= quiet <= 0.31, quiet  # the break, within 10 ms
    words = [w for c in chunks for w in c.words]
    assert [w.word for w in words] == ["Hello", "WHO", "Call", "9876543210", "today."]
    # written words, offsets into the document; the break is a gap between WHO and Call
    assert [DOC[w.offset : w.offset + len(w.word)] for w in words] == [w.word for w in words]
    assert words[2].start - words[1].end >= 0.3 - 1e-3


async def test_engine_lexicon_per_request_over_the_servers(real, tokenizer):
    engine, recorder, _ = real
    text = "Pay the EMI on Zomato, Asha."
    lexicon = {"en": {"EMI": "monthly instalment"}, "Asha": "Aashaa"}
    async for _ in engine.stream(text, request_id="lex-1", lexicon=lexicon, seed=1):
        pass
    async for _ in engine.stream(text, request_id="lex-2", seed=1):
        pass
    assert _prompt_texts(recorder, tokenizer, "lex-1") == [
        "Pay the monthly instalment on Zo mah toe, Aashaa."
    ]
    assert _prompt_texts(recorder, tokenizer, "lex-2") == ["Pay the E M I on Zo mah toe, Asha."]
    with pytest.raises(ValueError, match="contains the term itself"):
        async for _ in engine.stream(text, lexicon={"EMI": "EMI EMI"}):
            pass


async def test_openai_route_with_ssml_and_lexicon_in_extra_body(real, tokenizer):
    engine, recorder, server = real
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused")
    doc = 'Your <sub alias="instalment">EMI</sub> is due.<break time="500ms"/>Thanks, Asha.'
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=doc, response_format="pcm",
        extra_body={"ssml": True, "lexicon": {"en": {"Asha": "Aashaa"}}, "seed": 2},
    ) as response:  # fmt: skip
        pcm = np.frombuffer(await response.read(), dtype="<i2")
        rid = response.headers["x-request-id"]
    assert _prompt_texts(recorder, tokenizer, rid) == ["Your instalment is due.", "Thanks, Aashaa."]
    quiet = _longest_quiet_s(pcm, 24000)
    assert 0.49 <= quiet <= 0.51, quiet  # resampled to 24 kHz: the filter's edges, +-10 ms
    # without ssml the text is data: the tags are refused by nothing, and never parsed
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="a <b> c", response_format="pcm",
        extra_body={"seed": 2},
    ) as response:  # fmt: skip
        assert response.status_code == 200
        await response.read()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"input": "Hi <foo>there</foo>", "ssml": True}, "at character 3 .*unknown tag <foo>"),
        ({"input": "<speak>Hi", "ssml": True}, "at character 0 .*never closed"),
        ({"input": "x" * 10 + '<!ENTITY a "b">', "ssml": True}, "at character 10 .*DTDs"),
        ({"input": "Hi", "lexicon": {f"t{i}": "x" for i in range(1001)}}, "more than 1000"),
        ({"input": "Hi", "lexicon": {"Hi": "Hi there"}}, "contains the term itself"),
        ({"input": "Hi", "lexicon": ["Hi"]}, "option 'lexicon' must be a dict"),
        ({"input": "Hi", "ssml": "yes"}, "option 'ssml' must be a bool"),
    ],
)
async def test_openai_route_refuses_bad_markup_with_a_400(real, body, match):
    _, _, server = real
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", **body})
    assert r.status_code == 400, r.text
    assert re.search(match, r.json()["error"]["message"]), r.json()


async def test_openai_route_refuses_hostile_markup_fast(real):
    """The attacks against the real server: each refused in under 2 s, the server (this
    process) allocating under 16 MB at peak for all of them, and no engine request made."""
    import tracemalloc

    engine, recorder, server = real

    def deep(n: int) -> str:
        return "<s>" * n + "x" + "</s>" * n

    bomb = '<!DOCTYPE l [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><speak>&b;</speak>'
    many = {f"t{i}": "x" for i in range(4000)}  # (54 KB: under the body cap)
    cases = [
        ({"input": deep(10_000), "ssml": True}, 413, "over this server's cap"),  # (the text cap)
        ({"input": deep(500), "ssml": True}, 400, "nested deeper than 32"),  # (under it)
        ({"input": "<speak>" + "a" * 1_000_000 + "</speak>", "ssml": True}, 413, ""),
        ({"input": bomb, "ssml": True}, 400, "DTDs"),
        ({"input": "Hi", "lexicon": many}, 400, "more than 1000 entries"),
        ({"input": "Hi", "lexicon": {"Hi": "Hi Hi"}}, 400, "contains the term itself"),
    ]
    before = set(recorder.prompts)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        tracemalloc.start()
        try:
            for body, status, match in cases:
                r = await http.post(
                    "/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", **body}
                )
                assert r.status_code == status and match in r.text, r.text[:300]
                assert r.elapsed.total_seconds() < 2
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    assert set(recorder.prompts) == before  # nothing reached the model


async def test_websocket_ssml_and_lexicon(real, tokenizer):
    engine, recorder, server = real
    doc = '<speak>One.<break time="200ms"/><lang xml:lang="hi">5</lang> EMI.</speak>'
    async with RawClient.connect(server.ws_url) as client:
        await client.send({"type": "speak", "id": "a", "text": doc,
                           "options": {"ssml": True, "seed": 4,
                                       "lexicon": {"EMI": "easy money"}}})  # fmt: skip
        frames, done = await client.until_end("a")
        assert _prompt_texts(recorder, tokenizer, done.request_id) == ["One.", "पाँच easy money."]
        pcm = np.frombuffer(pcm_of(frames), dtype="<i2")
        assert 0.2 <= _longest_quiet_s(pcm, engine.sample_rate) <= 0.21
        await client.send({"type": "speak", "id": "b", "text": "<speak>x <foo/></speak>",
                           "options": {"ssml": True}})  # fmt: skip
        error = await client.recv()
        assert error.code == ErrorCode.BAD_MESSAGE and "at character 9" in error.message
        await client.send({"type": "speak", "id": "c", "text": "<speak>x", "final": False,
                           "options": {"ssml": True}})  # fmt: skip
        error = await client.recv()
        assert error.code == ErrorCode.BAD_MESSAGE and "final: true" in error.message
        await client.send({"type": "speak", "id": "d", "text": "x",
                           "options": {"lexicon": {"x": 5}}})  # fmt: skip
        error = await client.recv()
        assert error.code == ErrorCode.BAD_OPTIONS and "is not text" in error.message


# -- Pipecat's pronunciation hook --------------------------------------------------------------
async def test_pipecat_bot_with_a_pronunciation_map(real, tokenizer):
    """Pipecat's word -> IPA map (``pronunciation_transform_ipa``) through a real pipeline: a
    mappable word is read as its respelling, an unmappable one as written (Pipecat warns once),
    the rest of the text stays data (``&`` and ``<now>`` are not markup), and the words
    reported are the ones written."""
    engine, recorder, _ = real
    pronounce = VeenaTTSService.pronunciation_transform_ipa({"Nguyen": "ŋwiən", "Xhosa": "ǁʰosa"})
    text = "Ask Nguyen & Xhosa at 5 <now>."
    down, up = await run_test(
        VeenaTTSService(engine, seed=2, text_transforms=[("*", pronounce)]),
        frames_to_send=[TTSSpeakFrame(text)],
    )
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    # (a word of symbols only, "&", is not timed: as without markup)
    assert [f.text.strip() for f in words] == ["Ask", "Nguyen", "Xhosa", "at", "5", "<now>."]
    (context_id,) = {f.context_id for f in words}
    assert _prompt_texts(recorder, tokenizer, context_id) == ["Ask ngwian and Xhosa at five <now>."]
    assert any(f.num_frames for f in down if isinstance(f, TTSAudioRawFrame))


async def test_pipecat_service_settings_ssml_and_lexicon(real, tokenizer):
    engine, recorder, _ = real
    tts = VeenaTTSService(engine, seed=2, ssml=True, lexicon={"Asha": "Aashaa"})
    doc = 'Hi Asha.<break time="250ms"/><say-as interpret-as="characters">OK</say-as>.'
    down, up = await run_test(tts, frames_to_send=[TTSSpeakFrame(doc)])
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    (context_id,) = {f.context_id for f in words}
    assert _prompt_texts(recorder, tokenizer, context_id) == ["Hi Aashaa.", "O K."]
    assert [f.text.strip() for f in words] == ["Hi", "Asha.", "OK"]
    pcm = np.frombuffer(
        b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame)), dtype="<i2"
    )
    rate = next(f.sample_rate for f in down if isinstance(f, TTSAudioRawFrame))
    assert 0.24 <= _longest_quiet_s(pcm, rate) <= 0.26
    with pytest.raises(ValueError, match="contains the term itself"):
        VeenaTTSService(engine, lexicon={"Asha": "Asha ji"})


# -- LiveKit ---------------------------------------------------------------------------------
async def test_livekit_break_markup_and_lexicon(real, tokenizer):
    """LiveKit's expressive ``<break time>`` (lowered by ``VeenaTTS.Markup.convert``, as
    AgentSession does before synthesis) is an exact pause; the rest of the text stays data; a
    lexicon in the options is laid over the engine's."""
    from pipecat_veena.livekit import VeenaTTS

    engine, recorder, _ = real
    tts = VeenaTTS(engine, seed=5, lexicon={"Asha": "Aashaa"})
    text = tts.markup.convert('Hello Asha & co.<break time="0.4s"/>Bye.')
    assert text == 'Hello Asha & co.<break time="400ms"/>Bye.'
    frame = await tts.synthesize(text).collect()
    pcm = np.frombuffer(frame.data.tobytes(), dtype="<i2")
    assert 0.4 <= _longest_quiet_s(pcm, frame.sample_rate) <= 0.41
    requests = {rid.rsplit("-", 1)[0] for rid in recorder.prompts}
    said = [_prompt_texts(recorder, tokenizer, r) for r in requests]
    assert ["Hello Aashaa and co.", "Bye."] in said
    with pytest.raises(ValueError, match="more than 1000 entries"):
        VeenaTTS(engine, lexicon={f"t{i}": "x" for i in range(1001)})


# -- <prosody rate> and breaks at a speed ------------------------------------------------------
async def _length(engine: VeenaEngine, doc: str, **options) -> tuple[int, list]:
    chunks = [c async for c in engine.stream(doc, ssml=True, seed=8, **options)]
    return sum(c.num_samples for c in chunks), chunks


async def test_prosody_rate_stretches_its_span_only(real):
    """The same prompts and seed at rates 1, 2 and 0.5 on the second sentence: the first
    sentence's audio is the same, so the lengths say how the span alone was stretched."""
    engine, _, _ = real
    doc = 'Good morning to you. <prosody rate="{}">And a good day after it.</prosody>'
    ref, _ = await _length(engine, doc.format("1"))
    fast, chunks = await _length(engine, doc.format("2"))
    slow, _ = await _length(engine, doc.format("50%"))
    span = (slow - fast) / 1.5  # ref = A + B, fast = A + B/2, slow = A + 2B
    window = round(0.03 * engine.sample_rate)  # one analysis window
    assert span > 0.2 * engine.sample_rate
    assert abs((ref - fast) - span / 2) <= window, (ref, fast, slow)
    assert abs((slow - ref) - span) <= window, (ref, fast, slow)
    words = [w for c in chunks for w in c.words]
    assert [w.word for w in words][:2] == ["Good", "morning"]
    assert all(a.end <= b.start + 1e-3 for a, b in zip(words, words[1:], strict=False))
    assert words[-1].end <= fast / engine.sample_rate + 1e-3


@pytest.mark.parametrize("speed", [0.5, 1.5, 2.0])
async def test_a_break_stays_exact_at_a_speed(real, speed):
    """A break passes around the stretcher: 400 ms at any speed (within 10 ms: the quiet edges
    of the stretched words beside it)."""
    engine, _, _ = real
    _, chunks = await _length(engine, 'One two.<break time="400ms"/>Three four.', speed=speed)
    pcm = np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2")
    assert 0.4 <= _longest_quiet_s(pcm, engine.sample_rate) <= 0.41
    words = [w for c in chunks for w in c.words]
    assert [w.word for w in words] == ["One", "two.", "Three", "four."]
    assert words[2].start - words[1].end >= 0.4 - 1e-3  # the gap is the break, unstretched
    assert words[-1].end <= len(pcm) / engine.sample_rate + 1e-3


async def test_pipecat_over_the_remote_engine(real, tokenizer):
    """A Pipecat bot over RemoteVeenaEngine: its pronunciation map's tags and its lexicon reach
    the server's engine as SSML and options; the words come back as written."""
    from pipecat_veena.remote import RemoteVeenaEngine

    engine, recorder, server = real
    pronounce = VeenaTTSService.pronunciation_transform_ipa({"Nguyen": "ŋwiən"})
    async with RemoteVeenaEngine(server.url) as remote:
        before = set(recorder.prompts)
        down, up = await run_test(
            VeenaTTSService(
                remote, seed=9, lexicon={"Asha": "Aashaa"}, text_transforms=[("*", pronounce)]
            ),  # fmt: skip
            frames_to_send=[TTSSpeakFrame("Asha met Nguyen.")],
        )
        assert not [f for f in up if isinstance(f, ErrorFrame)]
        (request,) = {r.rsplit("-", 1)[0] for r in set(recorder.prompts) - before}
        assert _prompt_texts(recorder, tokenizer, request) == ["Aashaa met ngwian."]
        words = [f.text.strip() for f in down if isinstance(f, TTSTextFrame)]
        assert words == ["Asha", "met", "Nguyen"]  # (the word as written, in its tag)
        with pytest.raises(ValueError, match="contains the term itself"):
            VeenaTTSService(remote, lexicon={"Asha": "Asha ji"})


async def test_pipecat_ssml_from_an_llm_reply_cut_in_sentences(real, tokenizer):
    """An LLM's reply in <speak> streamed token by token: Pipecat cuts it into sentences, each
    spoken as a document (the <speak> around the reply dropped), breaks and tags within."""
    from pipecat.frames.frames import (
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )

    engine, recorder, _ = real
    reply = ('<speak>Your code is <say-as interpret-as="digits">42</say-as>.<break time="300ms"/> '
             'Call <sub alias="the bank">SBI</sub> today.</speak>')  # fmt: skip
    before = set(recorder.prompts)
    down, up = await run_test(
        VeenaTTSService(engine, seed=2, ssml=True),
        frames_to_send=[
            LLMFullResponseStartFrame(),
            *(LLMTextFrame(reply[i : i + 7]) for i in range(0, len(reply), 7)),
            LLMFullResponseEndFrame(),
        ],
    )
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    requests = sorted({r.rsplit("-", 1)[0] for r in set(recorder.prompts) - before})
    said = [t for r in requests for t in _prompt_texts(recorder, tokenizer, r)]
    assert sorted(said) == sorted(["Your code is four two.", "Call the bank today."])
    pcm = np.frombuffer(
        b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame)), dtype="<i2"
    )
    rate = next(f.sample_rate for f in down if isinstance(f, TTSAudioRawFrame))
    assert _longest_quiet_s(pcm, rate) >= 0.3 - 0.005
