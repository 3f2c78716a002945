"""VeenaEngine logic with a scripted generator and a numpy codec (fakes: see engine_fakes.py).

Covers stream length vs tokens, long text split into parts that reuse the first part's voice
prefix, voice pinning across requests, every guard (malformed stream, no audio, loops, runaway
cap), aborts by close and by request id, bad input errors and the one-loop rule. The same paths
run through the real vLLM engine and torch codecs in test_engine_real.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_fakes import (
    TEMPLATE,
    FakeBiCodec,
    ScriptedGenerator,
    make_checkpoint,
    spark_ids,
    well_formed,
)

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import (
    CheckpointError,
    EngineNotRunningError,
    MalformedStreamError,
    NoAudioError,
    UnknownVoiceError,
)
from pipecat_veena.streaming import StreamConfig

IDS = spark_ids()
VOICE = list(range(40, 72))


async def _engine(tmp_path, script, **config) -> tuple[VeenaEngine, ScriptedGenerator]:
    generator = ScriptedGenerator(script)
    cfg = EngineConfig(
        checkpoint=make_checkpoint(tmp_path, voices=config.pop("voices", None)),
        warmup=config.pop("warmup", False),
        stream=StreamConfig(first_frames=4, lookahead_frames=4, max_chunk_frames=64),
        **config,
    )
    engine = VeenaEngine(cfg, generator=generator, codec=FakeBiCodec())
    await engine.start()
    return engine, generator


async def _collect(engine: VeenaEngine, text: str, **kwargs) -> tuple[bytes, list]:
    chunks = [c async for c in engine.stream(text, **kwargs)]
    return b"".join(c.pcm for c in chunks), chunks


async def test_stream_length_matches_tokens(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=57))
    gen.step = 1
    pcm, chunks = await _collect(engine, "Hello world.")
    assert len(pcm) == 57 * 320 * 2
    assert all(c.sample_rate == 16000 for c in chunks)
    assert chunks[0].tokens == 3 + 32 + 4 + 4  # 3 markers, 32 globals, F + R semantics
    assert engine.stats()["unfinished_requests"] == 0
    await engine.shutdown()


async def test_long_text_continues_with_the_first_parts_globals(tmp_path):
    engine, gen = await _engine(
        tmp_path,
        well_formed(IDS, voice_globals=VOICE, semantics=10),
        max_part_chars=20,
        pin_voices=False,
    )
    pcm, _ = await _collect(engine, "First sentence here. Second one here. Third one.")
    assert len(gen.prompts) == 3
    prefix = [IDS.marker("start_global_token"), *IDS.global_ids(VOICE),
              IDS.marker("end_global_token")]  # fmt: skip
    assert gen.prompts[0][-1] != prefix[-1]
    for prompt in gen.prompts[1:]:
        assert prompt[-len(prefix) - 1 : -1] == prefix
        assert prompt[-1] == IDS.marker("start_semantic_token")
    assert len(pcm) == 3 * 10 * 320 * 2
    levels = np.unique(np.frombuffer(pcm, "<i2") // 100)
    assert len(levels) <= 12  # one voice (same global offset) throughout
    await engine.shutdown()


async def test_checkpoint_sets_the_part_length_unless_the_config_does(tmp_path):
    voices = {"template": TEMPLATE, "voices": {"nilay": {"speaker": "<|speaker_nilay|>"}},
              "max_part_chars": 40}  # fmt: skip
    script = well_formed(IDS, voice_globals=VOICE, semantics=5)
    text = "A first sentence of some length. A second sentence of some length."
    engine, gen = await _engine(tmp_path / "a", script, voices=voices)
    await _collect(engine, text)
    assert len(gen.prompts) == 2
    engine, gen = await _engine(tmp_path / "b", script, voices=voices, max_part_chars=220)
    await _collect(engine, text)
    assert len(gen.prompts) == 1


async def test_pinned_voice_skips_the_globals_next_time(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=20))
    gen.step = 1
    _, first = await _collect(engine, "Hello there.", voice="male")
    _, second = await _collect(engine, "Hello again.", voice="male")
    assert second[0].tokens == 4 + 4  # F + R semantic tokens, nothing else
    assert first[0].tokens == 3 + 32 + 4 + 4
    assert gen.prompts[1][-2] == IDS.marker("end_global_token")
    assert engine.stats()["pinned_voices"] == ["male"]
    await engine.shutdown()


def _varying_voice(semantics: int):
    """A well-formed script whose generated globals differ per request (as sampling would)."""
    count = [0]

    def script(prompt, options):
        count[0] += 1
        return well_formed(IDS, voice_globals=[count[0]] * 32, semantics=semantics)(prompt, options)

    return script


async def test_only_a_cleanly_completed_request_pins_its_voice(tmp_path):
    """A request that failed, was aborted or hit the runaway cap does not pin its voice; the
    next clean one does, and every later request then speaks with that voice."""
    engine, gen = await _engine(tmp_path, _varying_voice(semantics=30))
    stream = engine.stream("Interrupted before the end.", voice="male")
    await anext(stream)
    await stream.aclose()  # aborted
    assert engine.stats()["pinned_voices"] == []
    await _collect(engine, "Capped.", voice="male", max_tokens=50)  # the runaway cap
    assert engine.stats()["pinned_voices"] == []
    await _collect(engine, "Clean.", voice="male")  # the 3rd request, globals [3] * 32
    assert engine.stats()["pinned_voices"] == ["male"]
    await _collect(engine, "Later.", voice="male")
    assert gen.prompts[-1][-34:-2] == IDS.global_ids([3] * 32)
    await engine.shutdown()


async def test_pinned_voices_export_and_load_in_another_engine(tmp_path):
    first, _ = await _engine(tmp_path / "a", _varying_voice(semantics=10))
    await _collect(first, "Hi.", voice="male")
    await _collect(first, "Hi.", voice="female:high:low")
    path = tmp_path / "prints.json"
    data = first.export_voices(path)
    assert sorted(data["voices"]) == ["female:high:low", "male"]
    await first.shutdown()

    config = {"voices_file": path}
    second, gen = await _engine(tmp_path / "b", _varying_voice(semantics=10), **config)
    assert second.stats()["pinned_voices"] == ["female:high:low", "male"]
    await _collect(second, "Hi.", voice="male")
    assert gen.prompts[-1][-34:-2] == IDS.global_ids([1] * 32)  # the first engine's voice
    assert len(gen.prompts) == 1  # and no globals generated here
    await second.shutdown()


async def test_bad_voice_print_files_are_clear_errors(tmp_path):
    engine, _ = await _engine(tmp_path, _varying_voice(semantics=10))
    await _collect(engine, "Hi.", voice="male")
    good = engine.export_voices()
    entry = good["voices"]["male"]
    with pytest.raises(ValueError, match="not a voice-print file"):
        engine.load_voices({"voices": {}})
    with pytest.raises(UnknownVoiceError, match="robot"):
        engine.load_voices({**good, "voices": {"robot": entry}})
    with pytest.raises(ValueError, match="not a voice prefix of this model"):
        engine.load_voices({**good, "voices": {"male": {**entry, "prefix": entry["prefix"][:-1]}}})
    with pytest.raises(ValueError, match="do not match"):
        engine.load_voices({**good, "voices": {"male": {**entry, "globals": [0] * 32}}})
    with pytest.raises(ValueError, match="cannot read voice prints"):
        engine.load_voices(tmp_path / "missing.json")
    await engine.shutdown()


@pytest.mark.parametrize("globals_", [[1, 2], [4096] * 32, [-1] * 32, ["7"] * 32])
async def test_voices_json_globals_are_checked_at_load(tmp_path, globals_):
    voices = {"template": TEMPLATE, "voices": {"bad": {"globals": globals_}}}
    with pytest.raises(CheckpointError, match="32 global codes"):
        await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=8), voices=voices)


async def test_warmup_pins_the_default_voice_with_its_fixed_seed(tmp_path):
    engine, gen = await _engine(tmp_path, _varying_voice(semantics=10), warmup=True)
    assert engine.stats()["pinned_voices"] == ["female"]
    assert gen.options[0].seed == 0
    await engine.shutdown()


async def test_voice_with_fixed_globals_uses_the_clone_prompt(tmp_path):
    voices = {
        "template": TEMPLATE,
        "default_voice": "nilay",
        "voices": {"nilay": {"speaker": "<|speaker_nilay|>"}, "pinned": {"globals": VOICE}},
    }
    engine, gen = await _engine(
        tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=8), voices=voices
    )
    assert engine.voices == ["nilay", "pinned"]
    await _collect(engine, "Hi.", voice="pinned")
    assert gen.prompts[-1][-34:-2] == IDS.global_ids(VOICE)
    await _collect(engine, "Hi.")
    assert IDS.markers["start_global_token"] == gen.prompts[-1][-1]
    await engine.shutdown()


async def test_malformed_stream_is_an_error_and_leaves_nothing_running(tmp_path):
    def semantics_first(prompt, options):
        return [IDS.marker("start_global_token"), *IDS.global_ids(range(5)), IDS.semantic_base]

    engine, gen = await _engine(tmp_path, semantics_first)
    with pytest.raises(MalformedStreamError, match="5 of 32 global tokens"):
        await _collect(engine, "Hello.")
    assert gen.num_unfinished() == 0 and engine.stats()["active_streams"] == 0
    await engine.shutdown()


async def test_no_audio_for_speakable_text_is_an_error(tmp_path):
    def eos_only(prompt, options):
        return [IDS.marker("start_global_token"), *IDS.global_ids(VOICE),
                IDS.marker("end_global_token"), IDS.eos]  # fmt: skip

    engine, _ = await _engine(tmp_path, eos_only)
    with pytest.raises(NoAudioError, match="no audio"):
        await _collect(engine, "Hello.")
    await engine.shutdown()


async def test_control_strings_do_not_shape_the_parts(tmp_path):
    engine, gen = await _engine(
        tmp_path,
        well_formed(IDS, voice_globals=VOICE, semantics=5),
        max_part_chars=30,
        pin_voices=False,
    )
    await _collect(engine, "Hello <|im_end|> <|bicodec_global_7|> world, how are you?")
    await _collect(engine, "Hello world, how are you?")
    assert len(gen.prompts) == 2 and gen.prompts[0] == gen.prompts[1]
    await engine.shutdown()


async def test_unspeakable_text_yields_nothing_without_work(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=5))
    for text in ["", "   ", "<laugh>", "** --", "<|im_end|> <|bicodec_semantic_3|>"]:
        assert (await _collect(engine, text))[0] == b""
    assert gen.prompts == []
    await engine.shutdown()


async def test_looping_generation_is_stopped_with_audio_kept(tmp_path, caplog_loguru):
    def loop(prompt, options):
        head = [IDS.marker("start_global_token"), *IDS.global_ids(VOICE),
                IDS.marker("end_global_token"), IDS.marker("start_semantic_token")]  # fmt: skip
        varied = [IDS.semantic_base + (i * 37) % 8192 for i in range(60)]
        return head + varied + [IDS.semantic_base + 5 + i % 3 for i in range(3000)]

    engine, gen = await _engine(tmp_path, loop)
    pcm, _ = await _collect(engine, "A long sentence that would go on forever.")
    frames = len(pcm) // 640
    assert 60 + 150 <= frames <= 60 + 150 + 64
    assert gen.num_unfinished() == 0 and gen.aborted
    assert "looping" in caplog_loguru.text
    await engine.shutdown()


async def test_runaway_generation_hits_the_length_cap(tmp_path, caplog_loguru):
    def runaway(prompt, options):
        head = [IDS.marker("start_global_token"), *IDS.global_ids(VOICE),
                IDS.marker("end_global_token"), IDS.marker("start_semantic_token")]  # fmt: skip
        return head + [IDS.semantic_base + (i * 37) % 8192 for i in range(5000)]

    engine, gen = await _engine(tmp_path, runaway)
    pcm, _ = await _collect(engine, "Hi.")
    cap = gen.options[0].max_tokens
    assert cap == 32 + 16 + 3 * 50  # globals + marker allowance + 3 s (the floor) of semantics
    assert len(pcm) // 640 == cap - 35
    assert "runaway cap" in caplog_loguru.text
    await engine.shutdown()


async def test_closing_the_iterator_aborts_the_request(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=400))
    gen.delay = 0.001
    stream = engine.stream("Hello there.")
    first = await anext(stream)
    assert first.num_samples > 0
    assert gen.num_unfinished() == 1
    await stream.aclose()
    assert gen.num_unfinished() == 0 and len(gen.aborted) == 1
    assert engine.stats()["active_streams"] == 0
    await engine.shutdown()


async def test_cancelling_the_consumer_task_aborts_the_request(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=400))
    gen.delay = 0.001
    got = asyncio.Event()

    async def consume():
        async for _ in engine.stream("Hello there."):
            got.set()

    task = asyncio.create_task(consume())
    await got.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gen.num_unfinished() == 0 and engine.stats()["active_streams"] == 0
    await engine.shutdown()


async def test_abort_by_request_id_ends_the_stream_quietly(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=400))
    gen.delay = 0.001
    chunks = []
    async for chunk in engine.stream("Hello there.", request_id="ctx-1"):
        chunks.append(chunk)
        if len(chunks) == 2:
            assert await engine.abort("ctx-1") == 1
    assert len(chunks) == 2
    assert gen.num_unfinished() == 0
    await engine.shutdown()


async def test_bad_input_is_rejected_before_any_work(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=5))
    with pytest.raises(UnknownVoiceError, match="offers: female, male"):
        await _collect(engine, "Hi.", voice="robot")
    with pytest.raises(ValueError, match="unknown sampling option"):
        await _collect(engine, "Hi.", temprature=0.5)
    with pytest.raises(ValueError, match="top_p"):
        await _collect(engine, "Hi.", top_p=2.0)
    assert gen.prompts == []
    await engine.shutdown()
    with pytest.raises(EngineNotRunningError, match="not running"):
        await _collect(engine, "Hi.")


async def test_sampling_options_reach_the_generator(tmp_path):
    engine, gen = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=5))
    await _collect(engine, "Hi.", temperature=0.3, top_k=7, seed=11, repetition_penalty=1.2)
    opts = gen.options[0]
    assert (opts.temperature, opts.top_k, opts.seed, opts.repetition_penalty) == (0.3, 7, 11, 1.2)
    assert opts.stop_token_ids[0] == IDS.eos and opts.min_tokens == 35
    await engine.shutdown()


def test_engine_is_bound_to_its_loop(tmp_path):
    async def start():
        engine, _ = await _engine(tmp_path, well_formed(IDS, voice_globals=VOICE, semantics=5))
        return engine

    engine = asyncio.run(start())

    async def use():
        return await _collect(engine, "Hi.")

    with pytest.raises(EngineNotRunningError, match="another event loop"):
        asyncio.run(use())
