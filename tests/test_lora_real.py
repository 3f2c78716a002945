"""LoRA adapter voices on the real vLLM CPU engine (demo Veena LLM + SNAC), and through the server.

A copy of the demo Veena checkpoint gets two random adapters (tests/lora_adapters.py) and a
voices.json naming them: the engine starts vLLM with LoRA enabled and routes each adapter
voice's requests with its adapter; the base voices generate exactly what they generate on an
engine without LoRA (the session's ``veena_generator``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import httpx
import pytest
import pytest_asyncio
from lora_adapters import write_lora_adapter
from recording import RecordingGenerator

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import GenerationError
from pipecat_veena.remote import RemoteVeenaEngine
from pipecat_veena.server import ServerHandle, create_app

pytestmark = pytest.mark.vllm
TEXT = "Namaste, aap kaise hain?"
#: Tokens per request, few: a shared 2-core machine decodes a few tokens a second under load.
TOKENS = 28


@pytest.fixture(scope="module")
def lora_checkpoint(veena_checkpoint, tmp_path_factory):
    """A copy of the demo Veena checkpoint (the shared cache stays untouched) with adapters."""
    root = tmp_path_factory.mktemp("veena-lora") / "veena"
    shutil.copytree(veena_checkpoint, root)
    write_lora_adapter(root / "adapters" / "asha", root, seed=1, rank=8)
    write_lora_adapter(root / "adapters" / "ravi", root, seed=2, rank=4)
    voices = json.loads((root / "voices.json").read_text())
    # Same speaker tag as kavya: the prompts are identical, only the adapter differs.
    voices["voices"]["asha"] = {"speaker": "kavya", "lora": "adapters/asha"}
    voices["voices"]["ravi"] = {"speaker": "kavya", "lora": str(root / "adapters" / "ravi")}
    (root / "voices.json").unlink()  # a fresh file, whatever copytree made
    (root / "voices.json").write_text(json.dumps(voices))
    return root


@pytest_asyncio.fixture(scope="module")
async def lora_engine(lora_checkpoint):
    """An engine on the adapter checkpoint that starts its own vLLM (with LoRA)."""
    engine = VeenaEngine(
        EngineConfig(checkpoint=lora_checkpoint, warmup=False, max_model_len=2048, max_num_seqs=8)
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


@pytest_asyncio.fixture(scope="module")
async def base_engine(veena_checkpoint, veena_generator):
    """An engine on the demo checkpoint over the session's vLLM, which has no LoRA."""
    recorder = RecordingGenerator(veena_generator)
    engine = VeenaEngine(
        EngineConfig(checkpoint=veena_checkpoint, warmup=False, max_model_len=2048),
        generator=recorder,
    )
    await engine.start()
    yield engine, recorder
    await engine.shutdown()


async def _tokens(generator, engine: VeenaEngine, voice: str, rid: str) -> list[int]:
    """The first TOKENS ids ``generator`` generates for TEXT in ``voice``, seeded."""
    fmt = engine._format
    voice_obj = fmt.voices.resolve(voice)
    prompt = fmt.prompt(TEXT, voice_obj, None)
    options = fmt.options(
        replace(fmt.default_sampling, seed=11), TEXT, voice_obj, prefilled=False, rate=84.0
    )
    options = replace(options, min_tokens=0, max_tokens=TOKENS)
    out: list[int] = []
    async for delta in generator.generate(prompt, options, rid):
        out.extend(delta.token_ids)
    return out


async def test_vllm_starts_with_lora_sized_from_the_adapters(lora_engine):
    llm = lora_engine._generator._llm
    lora = llm.vllm_config.lora_config
    assert lora is not None
    assert (lora.max_loras, lora.max_lora_rank) == (2, 8)  # two adapters, ranks 8 and 4
    assert lora_engine.voices[:1] == ["kavya"] and {"asha", "ravi"} <= set(lora_engine.voices)


async def test_adapter_voices_change_the_tokens_and_base_voices_do_not(lora_engine, base_engine):
    base, _ = base_engine
    lora_gen, plain_gen = lora_engine._generator, base_engine[1].inner
    kavya_plain = await _tokens(plain_gen, base, "kavya", "plain-kavya")
    kavya_lora = await _tokens(lora_gen, lora_engine, "kavya", "lora-kavya")
    asha = await _tokens(lora_gen, lora_engine, "asha", "lora-asha")
    ravi = await _tokens(lora_gen, lora_engine, "ravi", "lora-ravi")
    assert len(kavya_plain) == TOKENS
    # Same prompt, same seed: a base voice is unchanged with LoRA enabled...
    assert kavya_lora == kavya_plain
    # ...and each adapter voice generates other tokens, each its own.
    assert asha != kavya_plain and ravi != kavya_plain and asha != ravi
    # Seeded adapter requests are reproducible, also with the other adapter in between.
    assert await _tokens(lora_gen, lora_engine, "asha", "lora-asha-again") == asha


async def test_engine_streams_adapter_voices_with_their_adapter(lora_engine, base_engine):
    base, base_recorder = base_engine
    # A second engine on the LoRA engine's vLLM, recording what it generates per request.
    recorder = RecordingGenerator(lora_engine._generator)
    config = EngineConfig(
        checkpoint=lora_engine.config.checkpoint, warmup=False, max_model_len=2048
    )
    engine = VeenaEngine(config, generator=recorder)
    await engine.start()

    async def speak(engine, recorder, voice, rid):
        stream = engine.stream(TEXT, voice=voice, request_id=rid, seed=3, max_tokens=2 * TOKENS)
        pcm = b"".join([c.pcm async for c in stream])
        return recorder.tokens_of(rid), len(pcm)

    try:
        kavya, kavya_audio = await speak(engine, recorder, "kavya", "kavya")
        asha, asha_audio = await speak(engine, recorder, "asha", "asha")
        plain, _ = await speak(base, base_recorder, "kavya", "plain")
    finally:
        await engine.shutdown()
    assert kavya_audio > 0 and asha_audio > 0
    assert kavya == plain and asha != kavya  # through stream(): the voice picks the adapter


async def test_a_generator_without_the_adapter_says_so(base_engine, lora_engine):
    _, recorder = base_engine
    fmt = lora_engine._format
    asha = fmt.voices.resolve("asha")
    options = fmt.options(fmt.default_sampling, TEXT, asha, prefilled=False, rate=84.0)
    with pytest.raises(GenerationError, match="started without LoRA adapter 'asha'"):
        async for _ in recorder.inner.generate(fmt.prompt(TEXT, asha, None), options, "no-lora"):
            pass


async def test_server_and_remote_engine_take_adapter_voices(lora_engine):
    handle = await ServerHandle(create_app(lora_engine, owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        async with httpx.AsyncClient(base_url=handle.url, timeout=60) as client:
            # An unknown voice is refused before any work; an adapter voice is not.
            body = {"model": "tts-1", "input": "Hi.", "response_format": "pcm"}
            reply = await client.post("/v1/audio/speech", json={**body, "voice": "nobody"})
            assert reply.status_code == 400 and "asha" in reply.text
        async with RemoteVeenaEngine(handle.url) as remote:
            assert {"asha", "ravi"} <= set(remote.voices)
            stream = remote.stream(TEXT, voice="ravi", seed=5, max_tokens=2 * TOKENS)
            chunks = [c async for c in stream]
            assert sum(len(c.pcm) for c in chunks) > 0
    finally:
        await handle.stop()
