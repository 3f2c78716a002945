"""BiCodec decode on CPU: our decoder vs flashtts's reference modules, and windowed-decode error.

Measures, in one run on the same cores (the machine is shared and noisy, so compare ratios):
- ms of compute (wall clock, ``--threads`` torch threads) per second of audio, real config,
  ``--tokens`` tokens, batch 1/4/8: reference fp32, ours fp32 (exact path), ours bf16 weights,
  ours fp32 under bf16 autocast, ours torch.compile (inductor, frozen weights) fp32 and bf16;
- parity of ours with the reference on the same weights, and bf16's SNR against fp32;
- windowed decode error against the full decode for right contexts R (left context = the
  receptive field): max abs and SNR in dB;
- write time of the real random checkpoint, peak RSS growth while loading it, tiny-config speed.

Run: ``.venv/bin/python -m benchmarks.codec_cpu`` (``--quick`` for a smoke run: fewer repeats,
no compile, no section written). ``--streamed``: only the receptive fields measured on the code
and the CPU time of streamed utterances, old (whole windows) against new (incremental windows).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from loguru import logger

from benchmarks._report import publish
from pipecat_veena.codecs.base import CodecWindow
from pipecat_veena.codecs.bicodec import BiCodecCodec, BiCodecDecoder, write_random_checkpoint
from pipecat_veena.codecs.bicodec.checkpoint import REAL_CONFIG
from pipecat_veena.codecs.bicodec.reference import ReferenceDetokenizer

COMMAND = ".venv/bin/python -m benchmarks.codec_cpu"
RIGHT_CONTEXTS = (0, 4, 8, 16, 32, 67)
EMIT = 25  # tokens emitted per window in the window-error curve

ROOT = Path(__file__).resolve().parent.parent


def _tokens(batch: int, steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 8192, (batch, steps), generator=gen),
        torch.randint(0, 4096, (batch, 32), generator=gen),
    )


def _snr_db(ref: torch.Tensor | np.ndarray, test: torch.Tensor | np.ndarray) -> float:
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    noise = np.mean((ref - test) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.mean(ref**2) / noise))


def _variants(ref_dir: Path, compile_: bool) -> dict[str, Callable]:
    """name -> decode(semantic, globals) returning (B, N) audio."""
    torch.manual_seed(0)
    reference = ReferenceDetokenizer(REAL_CONFIG).randomize(seed=1).eval()
    reference.save(ref_dir, REAL_CONFIG)
    fp32 = BiCodecDecoder.from_pretrained(ref_dir)
    bf16 = BiCodecDecoder.from_pretrained(ref_dir, dtype=torch.bfloat16)

    def autocast(sem: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fp32.decode(sem, glob)

    variants = {
        "reference fp32 (flashtts)": lambda s, g: reference(s, g)[:, 0],
        "ours fp32": fp32.decode,
        "ours bf16 weights": bf16.decode,
        "ours fp32 + bf16 autocast": autocast,
    }
    if compile_:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True  # weights become constants: prepacked conv weights
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            model = BiCodecDecoder.from_pretrained(ref_dir, dtype=dtype)
            model.compile()
            variants[f"ours {name} torch.compile"] = model.decode
    return variants


def _speed(variants: dict[str, Callable], batches: list[int], steps: int, repeats: int) -> dict:
    """Wall and process-CPU seconds per call, interleaving variants so noise hits all alike."""
    hop, rate = REAL_CONFIG["mel_params"]["hop_length"], REAL_CONFIG["mel_params"]["sample_rate"]
    times: dict[tuple[str, int], list[float]] = {}
    cpu_times: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], torch.Tensor] = {}
    for batch in batches:
        sem, glob = _tokens(batch, steps)
        for name, fn in variants.items():
            start = time.perf_counter()
            outputs[name, batch] = fn(sem, glob).float()  # warm-up (and compile)
            logger.info(f"{name} batch {batch}: warm-up {time.perf_counter() - start:.1f} s")
        for _ in range(repeats):
            for name, fn in variants.items():
                start, cpu = time.perf_counter(), time.process_time()
                fn(sem, glob)
                times.setdefault((name, batch), []).append(time.perf_counter() - start)
                cpu_times.setdefault((name, batch), []).append(time.process_time() - cpu)
    audio_s = {b: b * steps * hop / rate for b in batches}
    return {"times": times, "cpu": cpu_times, "audio_s": audio_s, "outputs": outputs}


def _window_curve(codec: BiCodecCodec, steps: int) -> list[tuple[int, float, float]]:
    """(R, max abs error, SNR dB) of emitted samples vs the full decode, left context = RF."""
    rng = np.random.default_rng(0)
    frames, glob = rng.integers(0, 8192, (steps, 1)), rng.integers(0, 4096, 32)
    hop, ctx = codec.samples_per_frame, codec.context_frames
    full = codec.decode_windows([CodecWindow(frames, glob)])[0]
    starts = range(ctx, steps - EMIT - max(RIGHT_CONTEXTS), 2 * EMIT)
    rows = []
    for right in RIGHT_CONTEXTS:
        windows = [CodecWindow(frames[s - ctx : s + EMIT + right], glob) for s in starts]
        decoded = codec.decode_windows(windows)
        got = np.concatenate([w[ctx * hop : (ctx + EMIT) * hop] for w in decoded])
        want = np.concatenate([full[s * hop : (s + EMIT) * hop] for s in starts])
        rows.append((right, float(np.abs(got - want).max()), _snr_db(want, got)))
    return rows


def measured_reach(codec: BiCodecCodec, steps: int = 200, tol: float = 1e-6) -> tuple[int, int]:
    """Tokens either side over which one changed token moves the output by more than ``tol``.

    Prenet: change one semantic id, compare the prenet outputs (max over channels, relative to
    the largest output value). Wave generator: add noise to one token of its input, compare the
    samples (relative to the largest sample), counted in whole tokens. Returns (prenet, wave).
    """
    dec = codec.decoder
    sem, glob = _tokens(1, steps, seed=3)
    t0 = steps // 2
    other = sem.clone()
    other[0, t0] = (int(sem[0, t0]) + 4099) % 8192
    with torch.inference_mode():
        speaker = dec.speaker_encoder(glob)
        base = dec.prenet(dec.quantizer(sem), speaker, None)
        moved = dec.prenet(dec.quantizer(other), speaker, None)
        change = (moved - base).abs().amax(dim=1)[0] / base.abs().max()
        prenet = int((torch.nonzero(change > tol)[:, 0] - t0).abs().max())
        x = base + speaker[:, :, None]
        nudged = x.clone()
        nudged[:, :, t0] += torch.randn(x.shape[1], generator=torch.Generator().manual_seed(1))
        wav = dec.decoder(x.clone(), [None] * 5)[0, 0]
        change = (dec.decoder(nudged, [None] * 5)[0, 0] - wav).abs() / wav.abs().max()
        tokens = torch.nonzero(change > tol)[:, 0] // dec.hop_length
        wave = int((tokens - t0).abs().max())
    return prenet, wave


def _lockstep(codec, streams: int, steps: int) -> tuple[float, int]:
    """``streams`` utterances of ``steps`` tokens, one token each per step, decoded together.

    The windows due at each step go to the codec in the DecodeBatcher's length groups. Returns
    (process CPU seconds inside codec calls, samples emitted).
    """
    from pipecat_veena.streaming import StreamDecoder
    from pipecat_veena.streaming.batching import group_by_length

    decoders, tokens = [], []
    for i in range(streams):
        sem, glob = _tokens(1, steps, seed=100 + i)
        decoders.append(StreamDecoder(codec, condition=glob[0].numpy()))
        tokens.append(sem[0].tolist())
    cpu, samples = 0.0, 0
    for step in range(steps + 1):
        jobs = [
            (d, job)
            for d, toks in zip(decoders, tokens, strict=True)
            for job in (d.plan([toks[step]]) if step < steps else d.plan_finish())
        ]
        for group in group_by_length([j.window.num_frames for _, j in jobs], 2.0):
            start = time.process_time()
            audios = codec.decode_windows([jobs[i][1].window for i in group])
            cpu += time.process_time() - start
            for i, audio in zip(group, audios, strict=True):
                samples += len(jobs[i][0].accept(jobs[i][1], audio))
    return cpu, samples


def _lockstep_cpu(codec, streams: int, steps: int) -> float:
    return _lockstep(codec, streams, steps)[0]


def streamed_section(quick: bool, reach: bool = True) -> str:
    """Receptive fields measured on the code, and streamed CPU time old against new."""
    from benchmarks.streaming import WholeWindows, _bicodec

    if not reach:
        codec = _bicodec("project")
        return _streamed_cpu(codec, WholeWindows(codec), quick)

    lines = [
        "Receptive fields measured on the code (real config, one token changed in 200, output "
        "change above 1e-6 of the largest output value), tokens on either side; the config's "
        "structural bound in brackets:",
        "",
        "| weights | prenet | wave generator |",
        "|---|---|---|",
    ]
    codec = None
    for kind in ("reference", "project"):
        codec = _bicodec(kind)
        cfg = codec.decoder.config
        prenet, wave = measured_reach(codec)
        bound = cfg.wave_margins[0]
        lines.append(f"| {kind} | {prenet} ({cfg.receptive_field - bound}) | {wave} ({bound}) |")
        logger.info(lines[-1])
    return "\n".join(lines) + "\n\n" + _streamed_cpu(codec, WholeWindows(codec), quick)


def _streamed_cpu(codec: BiCodecCodec, old, quick: bool) -> str:
    """Streamed CPU time, old against new, in float32 and in bfloat16 (new path only)."""
    import copy

    fast = BiCodecCodec(copy.deepcopy(codec.decoder).to(torch.bfloat16))
    repeats = 1 if quick else 3
    lines = [
        "",
        "Codec CPU time of whole utterances streamed with the default schedule (process time "
        f"inside codec calls, both threads, best of {repeats}), *project* weights, random tokens, "
        "ms of CPU per second of audio. *old*: every window decoded whole (before issue 21); "
        "*new*: the wave generator over the emitted frames plus its receptive field only, and "
        f"calls of at most {codec.single_thread_frames} frames on one thread (the default); "
        "bf16: the same weights in bfloat16 (what the start-up probe picks on a CPU "
        "with native bfloat16, as here). Batched cases: that many streams in lockstep, their "
        "due windows decoded together (the DecodeBatcher's length groups).",
        "",
        "| streams x length | offline fp32 | old fp32 | new fp32 | offline bf16 | new bf16 "
        "| new / offline: fp32; bf16 | old fp32 over new fp32; over new bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cases = [(1, 2), (1, 5)] if quick else [(1, 2), (1, 5), (4, 5), (8, 5)]
    for streams, seconds in cases:
        steps = seconds * 50
        sem = torch.cat([_tokens(1, steps, seed=100 + i)[0] for i in range(streams)])
        glob = torch.cat([_tokens(1, steps, seed=100 + i)[1] for i in range(streams)])
        cpu = {}
        for name, run in (
            ("offline fp32", partial(_cpu_timed, partial(codec.decoder.decode, sem, glob))),
            ("offline bf16", partial(_cpu_timed, partial(fast.decoder.decode, sem, glob))),
            ("old fp32", partial(_lockstep_cpu, old, streams, steps)),
            ("new fp32", partial(_lockstep_cpu, codec, streams, steps)),
            ("new bf16", partial(_lockstep_cpu, fast, streams, steps)),
        ):
            cpu[name] = min(run() for _ in range(repeats))
        per_s = {k: f"{1000 * v / (streams * seconds):.0f}" for k, v in cpu.items()}
        lines.append(
            f"| {streams} x {seconds} s | {per_s['offline fp32']} | {per_s['old fp32']} | "
            f"{per_s['new fp32']} | {per_s['offline bf16']} | {per_s['new bf16']} | "
            f"{cpu['new fp32'] / cpu['offline fp32']:.2f}x; "
            f"{cpu['new bf16'] / cpu['offline bf16']:.2f}x | "
            f"{cpu['old fp32'] / cpu['new fp32']:.2f}x; {cpu['old fp32'] / cpu['new bf16']:.2f}x |"
        )
        logger.info(lines[-1])
    return "\n".join(lines) + "\n"


def parts_section(repeats: int = 3) -> str:
    """CPU time of the prenet and the wave generator, one streamed stream against offline."""
    from benchmarks.streaming import _bicodec

    codec = _bicodec("project")
    dec, spent = codec.decoder, {"prenet": 0.0, "wave": 0.0}

    def timed(part: str, fn: Callable) -> Callable:
        def run(*args, **kwargs):
            start = time.process_time()
            out = fn(*args, **kwargs)
            spent[part] += time.process_time() - start
            return out

        return run

    dec.prenet.forward = timed("prenet", dec.prenet.forward)
    dec.decoder.forward = timed("wave", dec.decoder.forward)
    dec.decoder.forward_span = timed("wave", dec.decoder.forward_span)
    lines = [
        "One stream, *project* weights, fp32, 2 threads: process time inside each part of the "
        f"decoder (best of {repeats}), streamed with the default schedule against one offline "
        "decode of the same tokens.",
        "",
        "| length | prenet offline | prenet streamed | wave generator offline "
        "| wave generator streamed | prenet share offline; streamed |",
        "|---|---|---|---|---|---|",
    ]
    for seconds in (2, 5):
        steps = seconds * 50
        sem, glob = _tokens(1, steps, seed=100)
        best: dict[str, dict[str, float]] = {}
        for name, run in (
            ("offline", partial(dec.decode, sem, glob)),
            ("streamed", partial(_lockstep, codec, 1, steps)),
        ):
            for _ in range(repeats):
                spent.update(prenet=0.0, wave=0.0)
                run()
                if name not in best or sum(spent.values()) < sum(best[name].values()):
                    best[name] = dict(spent)
        off, st = best["offline"], best["streamed"]
        lines.append(
            f"| {seconds} s | {off['prenet']:.2f} s | {st['prenet']:.2f} s | {off['wave']:.2f} s "
            f"| {st['wave']:.2f} s | {off['prenet'] / sum(off.values()):.0%}; "
            f"{st['prenet'] / sum(st.values()):.0%} |"
        )
        logger.info(lines[-1])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--streamed",
        action="store_true",
        help="only the streamed section: receptive fields and streamed CPU time, old vs new",
    )
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run; writes no section")
    parser.add_argument("--no-reach", action="store_true", help="--streamed without the fields")
    parser.add_argument("--parts", action="store_true", help="only the prenet / generator split")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.batches, args.repeats, args.no_compile = 50, "1,2", 1, True
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    if args.parts:
        title = "BiCodec streamed on CPU: where the time goes"
        body = parts_section(1 if args.quick else 3)
        publish("codec_cpu_parts", title, COMMAND + " --parts", body, not args.quick)
        return
    if args.streamed:
        title = "BiCodec streamed on CPU: incremental windows"
        body = streamed_section(args.quick, reach=not args.no_reach)
        publish("codec_cpu_streamed", title, COMMAND + " --streamed", body, not args.quick)
        return

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        write_random_checkpoint(root / "real" / "BiCodec", "real")
        write_s = time.perf_counter() - start
        probe = subprocess.run(
            [sys.executable, "-m", "benchmarks.load_rss", str(root / "real")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        rss_mb, weights_mb = (float(x) / 2**20 for x in probe.stdout.split())

        real = BiCodecCodec.from_pretrained(root / "real")
        curve = _window_curve(real, steps=400 if not args.quick else 200)
        real_wav = real.decode_windows([CodecWindow(*_np_tokens(args.tokens))])[0]
        del real

        write_random_checkpoint(root / "tiny" / "BiCodec", "tiny")
        tiny = BiCodecDecoder.from_pretrained(root / "tiny")
        sem, glob = _tokens(1, args.tokens)
        tiny_wav = tiny.decode(sem, glob)
        torch.set_num_threads(1)
        tiny_ms = 1000 * min(_cpu_timed(lambda: tiny.decode(sem, glob)) for _ in range(5))
        torch.set_num_threads(args.threads)

        variants = _variants(root / "ref" / "BiCodec", compile_=not args.no_compile)
        speed = _speed(variants, batches, args.tokens, args.repeats)

    body = _report(args, batches, speed, curve, write_s, rss_mb, weights_mb, real_wav)
    body += (
        f"\nTiny config (tests): {args.tokens} tokens decode in {tiny_ms:.1f} ms of CPU time "
        f"(batch 1, 1 thread, best of 5); random-weight output rms "
        f"{float(tiny_wav.pow(2).mean().sqrt()):.3f}, peak {float(tiny_wav.abs().max()):.3f}.\n"
    )
    publish("codec_cpu", "BiCodec decoder on CPU (codec_cpu)", COMMAND, body, not args.quick)


def _np_tokens(steps: int) -> tuple[np.ndarray, np.ndarray]:
    sem, glob = _tokens(1, steps, seed=9)
    return sem.numpy().T.copy(), glob.numpy()[0]


def _cpu_timed(fn: Callable) -> float:
    """Process CPU seconds of one run of ``fn()``."""
    from benchmarks.streaming import cpu_seconds

    return cpu_seconds(fn)[1]


def _report(args, batches, speed, curve, write_s, rss_mb, weights_mb, real_wav) -> str:
    times, cpu, audio_s = speed["times"], speed["cpu"], speed["audio_s"]
    outputs = speed["outputs"]
    names = list(dict.fromkeys(name for name, _ in times))
    ref_name, exact = names[0], "ours fp32"
    head = "| variant | " + " | ".join(f"batch {b}: wall best / median; CPU" for b in batches)
    lines = [
        f"Real config, {args.tokens} tokens ({args.tokens / 50:.0f} s of audio per item), "
        f"{args.threads} threads, {args.repeats} interleaved runs. **ms per second of audio** "
        "(lower is better): wall clock best / median, then process CPU time (both threads "
        "summed, median; less sensitive to other load on the shared cores). x = the "
        "reference's time over ours, in this run (wall best; CPU).",
        "",
        head + " |",
        "|---|" + "---|" * len(batches),
    ]

    def per_audio(values: list[float], b: int, f: Callable = statistics.median) -> float:
        return 1000 * f(values) / audio_s[b]

    for name in names:
        cells = []
        for b in batches:
            best, med = per_audio(times[name, b], b, min), per_audio(times[name, b], b)
            cpu_med = per_audio(cpu[name, b], b)
            ref_best, ref_cpu = (
                per_audio(times[ref_name, b], b, min),
                per_audio(cpu[ref_name, b], b),
            )
            cells.append(
                f"{best:.0f} / {med:.0f}; {cpu_med:.0f} "
                f"({ref_best / best:.2f}x; {ref_cpu / cpu_med:.2f}x)"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Accuracy against the exact fp32 path on the same weights (batch 1):", ""]
    lines += ["| variant | max abs error | SNR dB |", "|---|---|---|"]
    want = outputs[exact, batches[0]]
    for name in names:
        got = outputs[name, batches[0]]
        err = float((got - want).abs().max())
        lines.append(f"| {name} | {err:.2e} | {_snr_db(want, got):.1f} |")
    lines += [
        "",
        f"Windowed decode (real config, random weights from write_random_checkpoint, rms "
        f"{float(np.sqrt(np.mean(real_wav**2))):.3f}): left context = receptive field, emit "
        f"{EMIT} tokens, error of the emitted samples against the full decode.",
        "",
        "| right context R (tokens) | max abs error | SNR dB |",
        "|---|---|---|",
    ]
    lines += [f"| {r} | {err:.2e} | {snr:.1f} |" for r, err, snr in curve]
    lines += [
        "",
        f"write_random_checkpoint('real'): {write_s:.1f} s. Loading it: peak RSS grows "
        f"{rss_mb:.0f} MiB for {weights_mb:.0f} MiB of fp32 weights (one copy; plain reads, "
        "no memory map).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
