"""Streaming figures: first-audio tokens, decode work, seam SNR and decode batching.

Every figure comes from the StreamDecoder the engine uses, fed one code at a time as an LLM emits
them, on random tokens with random codec weights (real BiCodec config; SNAC 24 kHz, noise off
unless stated), against one offline decode of the same tokens. Baselines run on the same tokens:
the seed's scheme (BiCodec: decode ALL semantics so far every 24 once 24 exist, emit only new
samples with 50 ms crossfades), Spark-Triton / FlashTTS independent chunks (50 tokens growing x2
to 400, 5-token overlap, 0.1 s crossfade) and Orpheus' 28-token SNAC window.

    .venv/bin/python -m benchmarks.streaming [--quick]
        [--only bicodec|snac|batching|incremental|snac-incremental]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from loguru import logger

from benchmarks._report import publish, update_section
from pipecat_veena.audio import snr_db
from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.streaming import StreamConfig, StreamDecoder
from pipecat_veena.streaming.batching import DecodeBatcher

GLOBALS = 32  # BiCodec global tokens the LLM emits before any semantic token (uncached voice)


@dataclass
class Run:
    """One streamed utterance: its audio and what it cost."""

    audio: np.ndarray
    first_audio_codes: int  # codes pushed before the first chunk came back
    work: float  # codec frames computed / frames in the utterance
    speed_needed: float  # LLM speed (x real time) for gapless playback, decode time aside
    frames_emitted: int


def stream(codec: AudioCodec, frames: np.ndarray, config: StreamConfig | None, cond=None) -> Run:
    """Push ``frames`` code by code through a StreamDecoder, as the engine does."""
    decoder = StreamDecoder(codec, config, condition=cond)
    k = codec.codes_per_frame
    chunks, arrivals = [], []  # arrivals: (codes pushed so far, frames already emitted)
    for i, code in enumerate(frames.reshape(-1).tolist(), start=1):
        before = decoder.frames_emitted
        new = decoder.push([code])
        arrivals += [(i, before)] if new else []
        chunks += new
    before = decoder.frames_emitted
    tail = decoder.finish()
    arrivals += [(frames.size, before)] if tail else []
    chunks += tail
    return Run(
        audio=np.concatenate(chunks),
        first_audio_codes=arrivals[0][0],
        work=decoder.frames_decoded / len(frames),
        speed_needed=_speed_needed([(c / k, e) for c, e in arrivals]),
        frames_emitted=decoder.frames_emitted,
    )


def _speed_needed(arrivals: list[tuple[float, int]]) -> float:
    """Smallest LLM speed v (frames per frame-duration) with no gap once playback started.

    A chunk arriving after ``a`` frames of tokens, with ``e`` frames already emitted, must arrive
    before playback (started at the first chunk) runs out: (a - a0) / v <= e.
    """
    a0 = arrivals[0][0]
    return max([1.0] + [(a - a0) / e for a, e in arrivals[1:] if e > 0])


def _decode(codec: AudioCodec, frames: np.ndarray, cond=None, start: int = 0) -> np.ndarray:
    return codec.decode_windows([CodecWindow(frames=frames, condition=cond, start=start)])[0]


def _fade(tail: np.ndarray, head: np.ndarray) -> np.ndarray:
    ramp = (np.arange(len(tail), dtype=np.float32) + 0.5) / len(tail)
    return tail * (1 - ramp) + head * ramp


def seed_decode_ends(total: int, interval: int = 24) -> list[int]:
    """Frame counts at which the seed decodes everything so far (every 24, then the rest)."""
    ends = list(range(interval, total + 1, interval))
    return ends + ([total] if not ends or ends[-1] != total else [])


def seed_scheme(codec: AudioCodec, frames: np.ndarray, cond, *, interval: int = 24) -> Run:
    """The seed: decode all frames so far every ``interval``, emit new samples, 50 ms fades."""
    fade = codec.sample_rate // 20
    out, tail, emitted, computed = [], None, 0, 0
    ends = seed_decode_ends(len(frames), interval)
    for end in ends:
        audio = _decode(codec, frames[:end], cond)
        computed += end
        new = audio[emitted:]
        if tail is not None:
            new = np.concatenate([_fade(tail, new[: len(tail)]), new[len(tail) :]])
        final = end == len(frames)
        emit, tail = (new, None) if final else (new[:-fade], new[-fade:])
        out.append(emit)
        emitted += len(emit)
    # Playback needs chunk k (at ``ends[k]`` tokens) before the audio emitted so far runs out.
    emitted_frames = [interval * k - fade / codec.samples_per_frame for k in range(len(ends))]
    arrivals = [(float(e), f) for e, f in zip(ends, emitted_frames, strict=True)]
    return Run(np.concatenate(out), interval, computed / len(frames),
               _speed_needed(arrivals), len(frames))  # fmt: skip


def triton_scheme(codec: AudioCodec, frames: np.ndarray, cond, *, first: int = 50) -> Run:
    """Spark Triton / FlashTTS: independent chunks growing x2 to 400, 5-frame overlap faded."""
    overlap, size, start = 5, first, 0
    fade = overlap * codec.samples_per_frame
    out, tail, computed = [], None, 0
    while True:
        end = min(len(frames), start + size)
        audio = _decode(codec, frames[start:end], cond)
        computed += end - start
        if tail is not None:
            audio = np.concatenate([_fade(tail, audio[:fade]), audio[fade:]])
        if end == len(frames):
            out.append(audio)
            break
        out.append(audio[:-fade])
        tail, start, size = audio[-fade:], end - overlap, min(400, size * 2)
    return Run(np.concatenate(out), first, computed / len(frames), float("nan"), len(frames))


def orpheus_scheme(codec: AudioCodec, frames: np.ndarray) -> tuple[Run, slice]:
    """Orpheus: once 4 frames exist, after each frame decode the last 4 and keep the 2nd."""
    spf = codec.samples_per_frame
    out = [_decode(codec, frames[n - 4 : n], start=n - 4)[spf : 2 * spf]
           for n in range(4, len(frames) + 1)]  # fmt: skip
    run = Run(np.concatenate(out), 28, 4 * len(out) / len(frames), 1.0, len(out))
    return run, slice(spf, (len(out) + 1) * spf)  # the samples it emits: frames 1 .. n-3


class WholeWindows(AudioCodec):
    """The decode before incremental windows: every window decoded whole, then cut to ``keep``.

    Wraps a codec for old-versus-new figures only; the package has one path (``keep``).
    """

    def __init__(self, codec: AudioCodec) -> None:
        self.codec = codec
        for name in ("sample_rate", "samples_per_frame", "codes_per_frame", "condition_size",
                     "context_frames"):  # fmt: skip
            setattr(self, name, getattr(codec, name))

    def decode_windows(self, windows):  # noqa: D102 (AudioCodec's)
        whole = [replace(w, keep=None) for w in windows]
        audios = self.codec.decode_windows(whole)
        return [self.kept_audio(w, a) for w, a in zip(windows, audios, strict=True)]


def decode_flops(fn) -> tuple[object, int]:
    """Run ``fn()`` and count the floating-point operations torch executes for it."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn()
    return out, counter.get_total_flops()


def incremental_section(quick: bool) -> str:
    """Old (whole windows) against new (generator over the kept frames): work and seams."""
    lengths = (2, 5) if quick else (2, 5, 20, 60)
    lines = [
        "Decode work = floating-point operations of all the stream's codec calls (torch's "
        "FlopCounterMode: convolutions and matrix products) over those of one offline decode of "
        "the same tokens. *old*: every window decoded whole (prenet and wave generator over "
        "L + chunk + R); *new* (default): the prenet over the window, the wave generator over "
        "the emitted frames plus its own receptive field, cut down after every layer. Default "
        "schedule, real config, random weights of both kinds, SNR of the stream against the "
        "offline decode.",
        "",
        "| utterance | weights | first audio | work old | work new | SNR old | SNR new | "
        "max abs new - old |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("reference", "project"):
        codec = _bicodec(kind)
        cond = np.random.default_rng(9).integers(0, 4096, size=codec.condition_size)
        for seconds in lengths:
            frames = _random_frames(codec, seconds, seed=seconds)
            offline, offline_flops = decode_flops(partial(_decode, codec, frames, cond))
            cfg = StreamConfig.for_codec(codec)
            old, old_flops = decode_flops(partial(stream, WholeWindows(codec), frames, cfg, cond))
            new, new_flops = decode_flops(partial(stream, codec, frames, cfg, cond))
            lines.append(_row([
                f"{seconds} s", kind, f"{GLOBALS} + {new.first_audio_codes}",
                f"{old_flops / offline_flops:.2f}", f"{new_flops / offline_flops:.2f}",
                f"{snr_db(offline, old.audio):.1f} dB", f"{snr_db(offline, new.audio):.1f} dB",
                f"{np.abs(new.audio - old.audio).max():.1e}",
            ]))  # fmt: skip
            logger.info(lines[-1])
    return "\n".join(lines)


def cpu_seconds(fn: Callable[[], object], repeats: int = 1) -> tuple[object, float]:
    """Run ``fn()`` ``repeats`` times: (its result, the least process CPU time of one run)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        out = fn()
        best = min(best, time.process_time() - start)
    return out, best


def snac_incremental_section(quick: bool) -> str:
    """SNAC old (whole windows) against new (each stage over what the kept frames need)."""
    from pipecat_veena.codecs.snac import SnacCodec, write_random_checkpoint

    lengths = (2, 5) if quick else (2, 5, 20, 60)
    with tempfile.TemporaryDirectory() as tmp:
        codec = SnacCodec.from_pretrained(write_random_checkpoint(Path(tmp), seed=0))
    cfg = StreamConfig.for_codec(codec)
    lines = [
        "SNAC 24 kHz, random weights (seed 0), position-keyed noise on, default schedule (F="
        f"{cfg.first_frames}, R={cfg.lookahead_frames}, L={cfg.left_context(codec)} frames, "
        f"growth x{cfg.growth:g}, max {cfg.max_chunk_frames}), one stream, fp32, "
        f"{torch.get_num_threads()} torch threads. *old*: every window decoded whole "
        "(L + chunk + R frames through every stage); *new* (default): before each decoder "
        "stage the activations are cut to the kept frames plus the receptive field of the "
        "stages left. Work = FLOPs of the stream's codec calls over one offline decode; CPU = "
        "process time of the whole stream over that of one offline decode (best of 2).",
        "",
        "| utterance | frames | work old | work new | CPU old | CPU new | old / new CPU | "
        "SNR new | max abs new - old |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seconds in lengths:
        frames = _random_frames(codec, seconds, seed=seconds)
        offline, offline_flops = decode_flops(partial(_decode, codec, frames))
        _, old_flops = decode_flops(partial(stream, WholeWindows(codec), frames, cfg))
        _, new_flops = decode_flops(partial(stream, codec, frames, cfg))
        _, offline_cpu = cpu_seconds(partial(_decode, codec, frames), 2)
        old, old_cpu = cpu_seconds(partial(stream, WholeWindows(codec), frames, cfg), 2)
        new, new_cpu = cpu_seconds(partial(stream, codec, frames, cfg), 2)
        lines.append(_row([
            f"{seconds} s", len(frames), f"{old_flops / offline_flops:.2f}",
            f"{new_flops / offline_flops:.2f}", f"{old_cpu / offline_cpu:.2f}x",
            f"{new_cpu / offline_cpu:.2f}x", f"{old_cpu / new_cpu:.2f}",
            f"{snr_db(offline, new.audio):.1f} dB", f"{np.abs(new.audio - old.audio).max():.1e}",
        ]))  # fmt: skip
        logger.info(lines[-1])
    return "\n".join(lines)


def _random_frames(codec: AudioCodec, seconds: float, seed: int) -> np.ndarray:
    n = round(seconds * codec.frame_rate)
    high = 4096 if codec.codes_per_frame == 7 else 8192
    return np.random.default_rng(seed).integers(0, high, size=(n, codec.codes_per_frame))


def _bicodec(kind: str):
    """The real-config BiCodec with random weights of one of two kinds (both seed 0).

    "reference": flashtts' own modules and init (trunc-normal 0.02, layer scale 1/N), the
    conditions of the orientation figures in issue 4; "project": write_random_checkpoint's
    weights, scaled for audible output, whose layers couple more strongly (wider effective
    receptive field).
    """
    from pipecat_veena.codecs.bicodec import BiCodecCodec, write_random_checkpoint
    from pipecat_veena.codecs.bicodec.checkpoint import REAL_CONFIG
    from pipecat_veena.codecs.bicodec.reference import ReferenceDetokenizer

    with tempfile.TemporaryDirectory() as tmp:
        if kind == "project":
            return BiCodecCodec.from_pretrained(write_random_checkpoint(tmp, "real", seed=0))
        with torch.random.fork_rng():
            torch.manual_seed(0)
            ReferenceDetokenizer(REAL_CONFIG).save(tmp, REAL_CONFIG)
        return BiCodecCodec.from_pretrained(tmp)


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _quality(offline: np.ndarray, run: Run) -> list[str]:
    return [f"{snr_db(offline, run.audio):.1f} dB", f"{np.abs(offline - run.audio).max():.1e}"]


def _scheme_row(name: str, run: Run, offline: np.ndarray) -> str:
    return _row([name, f"{GLOBALS} + {run.first_audio_codes}", f"{run.work:.2f}",
                 *_quality(offline, run)])  # fmt: skip


def bicodec_section(quick: bool) -> str:
    lengths, curve_s = ((5, 20), 5) if quick else ((5, 20, 60), 10)
    reference = _bicodec("reference")
    cond = np.random.default_rng(9).integers(0, 4096, size=reference.condition_size)
    cfg = StreamConfig.for_codec(reference)
    left = cfg.left_context(reference)
    lines = [
        f"BiCodec, real config, random weights; receptive field {reference.context_frames} "
        f"tokens. Defaults: F={cfg.first_frames}, R={cfg.lookahead_frames}, L={left}, growth "
        f"x{cfg.growth:g}, max chunk {cfg.max_chunk_frames}. First audio counts LLM tokens: "
        f"{GLOBALS} globals (none with a cached voice) + semantic tokens. *reference* weights: "
        "flashtts' modules and init (the conditions of the issue's orientation figures); "
        "*project* weights: write_random_checkpoint (louder, more strongly coupled layers).",
        "",
        "Defaults over utterance length (*reference* weights), seed's work counted on the same "
        "schedule:",
        "",
        "| utterance | first audio | decode work (computed / emitted) | seed's work | "
        "SNR vs offline | max abs error | LLM speed for gapless play |",
        "|---|---|---|---|---|---|---|",
    ]
    for seconds in lengths:
        frames = _random_frames(reference, seconds, seed=seconds)
        run = stream(reference, frames, cfg, cond)
        seed_work = sum(seed_decode_ends(len(frames))) / len(frames)
        lines.append(_row([f"{seconds} s", f"{GLOBALS} + {run.first_audio_codes}",
                           f"{run.work:.2f}", f"{seed_work:.1f}",
                           *_quality(_decode(reference, frames, cond), run),
                           f"{run.speed_needed:.2f}x"]))  # fmt: skip
    frames = _random_frames(reference, curve_s, seed=1)
    curve: dict[int, list[str]] = {}
    baselines = []
    for kind in ("reference", "project"):
        codec = reference if kind == "reference" else _bicodec("project")
        offline = _decode(codec, frames, cond)
        for r in (0, 4, 8, 12, 16, 24, 32, 48, 67):
            run = stream(codec, frames, replace(cfg, lookahead_frames=r), cond)
            curve.setdefault(r, [r, f"{GLOBALS} + {run.first_audio_codes}", f"{run.work:.2f}"])
            curve[r].append(_quality(offline, run)[0])
            if r == cfg.lookahead_frames:
                baselines.append(_scheme_row(f"ours (defaults), {kind}", run, offline))
        for name, scheme in (("seed: all every 24, 50 ms fades", seed_scheme),
                             ("Triton/FlashTTS: independent chunks", triton_scheme)):  # fmt: skip
            baselines.append(_scheme_row(f"{name}, {kind}", scheme(codec, frames, cond), offline))
    lines += ["", f"Same {curve_s} s of tokens ({len(frames)}), ours against the baselines:", "",
              "| scheme, weights | first audio | decode work | SNR vs offline | max abs error |",
              "|---|---|---|---|---|", *baselines, "",
              f"Seam SNR over the lookahead R (same tokens, F={cfg.first_frames}, L={left}):", "",
              "| R (tokens) | first audio | decode work | SNR, reference weights | "
              "SNR, project weights |", "|---|---|---|---|---|",
              *(_row(c) for c in curve.values())]  # fmt: skip
    return "\n".join(lines)


def snac_section(snac_dir: Path) -> str:
    from pipecat_veena.codecs.snac import SnacCodec

    quiet = SnacCodec.from_pretrained(snac_dir, noise=False)
    noisy = SnacCodec.from_pretrained(snac_dir)
    cfg = StreamConfig.for_codec(quiet)
    frames = _random_frames(quiet, 120 / quiet.frame_rate, seed=0)  # 120 frames = 840 tokens
    offline = _decode(quiet, frames)
    orpheus, kept = orpheus_scheme(quiet, frames)
    ours = stream(quiet, frames, cfg)
    lines = [
        f"SNAC 24 kHz, random weights (seed 0), {len(frames)} frames ({frames.size} tokens); "
        f"receptive field {quiet.context_frames} frames. Defaults: F={cfg.first_frames}, "
        f"R={cfg.lookahead_frames}, L={cfg.left_context(quiet)} frames, growth x{cfg.growth:g}.",
        "",
        "| scheme | noise | frames emitted | first audio (tokens) | decode work (computed / "
        "utterance frames) | SNR vs offline | max abs error |",
        "|---|---|---|---|---|---|---|",
        f"| Orpheus 28-token window | off | {orpheus.frames_emitted} of {len(frames)} | 28 | "
        f"{orpheus.work:.2f} | {snr_db(offline[kept], orpheus.audio):.1f} dB (on what it emits) "
        f"| {np.abs(offline[kept] - orpheus.audio).max():.1e} |",
    ]
    runs = [
        ("ours (defaults)", "off", quiet, cfg),
        ("ours (defaults)", "position-keyed", noisy, cfg),
    ]
    for r in (1, 3):
        runs.append((f"ours, R={r}", "off", quiet, replace(cfg, lookahead_frames=r)))
    runs.append(("ours, L=R=3 (exact)", "position-keyed", noisy, replace(cfg, lookahead_frames=3)))
    for name, noise, codec, config in runs:
        run = ours if codec is quiet and config == cfg else stream(codec, frames, config)
        ref = offline if codec is quiet else _decode(noisy, frames)
        lines.append(
            f"| {name} | {noise} | {run.frames_emitted} of {len(frames)} | "
            f"{run.first_audio_codes} | {run.work:.2f} | {snr_db(ref, run.audio):.1f} dB | "
            f"{np.abs(ref - run.audio).max():.1e} |"
        )
    return "\n".join(lines)


async def _batched_streams(codec: AudioCodec, n: int, frames: int, cond) -> dict:
    """``n`` streams pushing one code per loop turn in lockstep through one DecodeBatcher."""
    batcher = DecodeBatcher(codec)
    rng = np.random.default_rng(n)

    async def one(seed: int) -> int:
        decoder = StreamDecoder(codec, condition=cond)
        codes = _random_frames(codec, frames / codec.frame_rate, seed).reshape(-1).tolist()
        for code in codes:
            for job in decoder.plan([code]):
                decoder.accept(job, await batcher.decode(job.window))
            await asyncio.sleep(0)
        for job in decoder.plan_finish():
            decoder.accept(job, await batcher.decode(job.window))
        return decoder.frames_decoded

    start = time.perf_counter()
    computed = sum(await asyncio.gather(*(one(int(s)) for s in rng.integers(0, 1 << 30, n))))
    wall = time.perf_counter() - start
    await batcher.close()
    stats = batcher.stats()
    return {**stats, "computed": computed, "wall": wall}


def batching_section(codecs: list[tuple[str, AudioCodec, object, int]]) -> str:
    lines = [
        "Concurrent streams in lockstep (one code per event-loop turn each), default stream "
        "config, DecodeBatcher(max_batch=16, max_wait_ms=2, max_pad_ratio=2), CPU:",
        "",
        "| codec | streams | frames each | mean batch size | codec calls | decode time per "
        "computed frame | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, codec, cond, frames in codecs:
        for n in (1, 4, 16):
            s = asyncio.run(_batched_streams(codec, n, frames, cond))
            lines.append(
                f"| {name} | {n} | {frames} | {s['mean_batch_size']:.2f} | {s['codec_calls']} | "
                f"{1000 * s['decode_seconds'] / s['computed']:.2f} ms | {s['wall']:.1f} s |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter utterances (smoke run)")
    parser.add_argument(
        "--only", choices=("bicodec", "snac", "batching", "incremental", "snac-incremental")
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    from pipecat_veena.codecs.snac import SnacCodec, write_random_checkpoint

    parts, command = [], "python -m benchmarks.streaming" + (" --quick" if args.quick else "")
    if args.only == "incremental":
        title = "Streaming: incremental BiCodec windows"
        body = incremental_section(args.quick)
        publish("streaming_incremental", title, command + " --only incremental", body,
                not args.quick)  # fmt: skip
        return
    if args.only == "snac-incremental":
        title = "Streaming: incremental SNAC windows"
        body = snac_incremental_section(args.quick)
        publish("streaming_snac_incremental", title, command + " --only snac-incremental", body,
                not args.quick)  # fmt: skip
        return
    with tempfile.TemporaryDirectory() as tmp:
        snac_dir = write_random_checkpoint(Path(tmp) / "snac", seed=0)
        if args.only in (None, "bicodec"):
            parts.append("### BiCodec\n\n" + bicodec_section(args.quick))
        if args.only in (None, "snac"):
            parts.append("### SNAC\n\n" + snac_section(snac_dir))
        if args.only in (None, "batching"):
            bicodec = _bicodec("reference")
            globals_ = np.random.default_rng(9).integers(0, 4096, size=bicodec.condition_size)
            codecs = [("SNAC", SnacCodec.from_pretrained(snac_dir), None, 24),
                      ("BiCodec (real)", bicodec, globals_, 50)]  # fmt: skip
            parts.append("### Decode batching\n\n" + batching_section(codecs))
    body = "\n\n".join(parts)
    if args.only is None and not args.quick:
        update_section("streaming", "Streaming: first audio, decode work, seams, batching",
                       command, body)  # fmt: skip
    logger.info(f"streaming benchmark:\n{body}")


if __name__ == "__main__":
    main()
