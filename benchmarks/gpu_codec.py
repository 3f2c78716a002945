"""BiCodec decode throughput on a GPU: real-time factor and streams per GPU, batch 1 to 64.

Needs only torch, numpy and this package (no vLLM, no checkpoint: the real config's weights are
written at random into a temp dir, which also exercises the loader). For each dtype (fp32, bf16)
and mode it times the decoder's continuous path (features -> waveform; the id lookups around it
are negligible) on ``--tokens`` tokens:
- ``eager``: plain PyTorch under inference_mode;
- ``graph``: the same forward captured once per batch size in a CUDA graph and replayed;
- ``compile``: ``torch.compile(mode="reduce-overhead")`` (inductor + CUDA graphs; slow to
  compile, one compile per batch size, so not in the default ``--modes``).

A second table times one streamed window (``--window L,E,R``: left context, emitted frames,
lookahead; default the steady state of the default schedule, 67,32,16) decoded *whole* (the old
path: prenet and wave generator over L + E + R) and *kept* (the default: the wave generator
over the E emitted frames plus its own receptive field), eager, per batch and dtype; RTF there
is per emitted second, and the last column is the kept samples' SNR against the whole decode.

Columns: ms per call; RTF = compute time / audio duration of one stream (below 1 is faster than
real time); streams/GPU = batch / RTF, the real-time streams one GPU sustains at that batch; SNR
of the first item against fp32 eager; peak memory.

On the lent GPU, one call (about 3 to 5 minutes):
    PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_codec
Smoke run on CPU (tiny config, small batches, eager + torch.compile):
    .venv/bin/python -m benchmarks.gpu_codec --device cpu --quick
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


def _ensure_loguru() -> None:
    """The GPU image has no loguru: stand in with the standard logging module (same calls)."""
    try:
        import loguru  # noqa: F401
    except ImportError:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        module = types.ModuleType("loguru")
        module.logger = logging.getLogger("pipecat_veena")  # type: ignore[attr-defined]
        sys.modules["loguru"] = module


_ensure_loguru()

from pipecat_veena.codecs.bicodec import BiCodecDecoder, write_random_checkpoint  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _graphed(model: BiCodecDecoder, features: torch.Tensor, speaker: torch.Tensor) -> Callable:
    """Capture model(features, speaker) in a CUDA graph; the returned call replays it."""
    static_f, static_s = features.clone(), speaker.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(2):
            model(static_f, static_s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        out = model(static_f, static_s)

    def run() -> torch.Tensor:
        graph.replay()
        return out

    return run


def _runner(mode: str, model: BiCodecDecoder, features, speaker) -> Callable[[], torch.Tensor]:
    if mode == "graph":
        return _graphed(model, features, speaker)
    if mode == "compile":
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    else:
        compiled = model

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return compiled(features, speaker)

    return run


def _time(run: Callable, device: torch.device, iters: int) -> tuple[float, torch.Tensor]:
    out = run()  # warm-up (compile, autotune, allocator)
    out = run()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        out = run()
    _sync(device)
    return (time.perf_counter() - start) / iters, out


def _snr(ref: torch.Tensor, test: torch.Tensor) -> float:
    ref, test = ref.double().cpu(), test.double().cpu()
    noise = float((ref - test).pow(2).mean())
    return float("inf") if noise == 0 else 10 * float(np.log10(float(ref.pow(2).mean()) / noise))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", default="real", choices=("real", "tiny"))
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--modes", default=None, help="eager,graph,compile (default: eager,graph)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--window", default="67,32,16", help="L,E,R of the windowed table")
    parser.add_argument("--quick", action="store_true", help="tiny config, batch 1-2, 50 tokens")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.quick:
        args.config, args.tokens, args.batches, args.iters = "tiny", 50, "1,2", 2
    if args.modes is None:
        args.modes = "eager,graph" if device.type == "cuda" else "eager,compile"
    modes = args.modes.split(",")
    if "graph" in modes and device.type != "cuda":
        raise SystemExit("--modes graph needs a CUDA device (use eager,compile on CPU)")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        print(
            f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}, fp32 convs "
            f"{'may use TF32' if torch.backends.cudnn.allow_tf32 else 'exact fp32'}"
        )

    with tempfile.TemporaryDirectory() as tmp:
        write_random_checkpoint(Path(tmp) / "BiCodec", args.config)
        models = {
            name: BiCodecDecoder.from_pretrained(tmp, device=device, dtype=DTYPES[name])
            for name in args.dtypes.split(",")
        }

    first = next(iter(models.values()))
    audio_s = args.tokens * first.hop_length / first.sample_rate
    print(f"# {args.config} config, {args.tokens} tokens = {audio_s:.2f} s of audio per stream")
    print("| dtype | mode | batch | ms/call | RTF | streams/GPU | SNR vs fp32 dB | peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for batch in (int(b) for b in args.batches.split(",")):
        semantic = torch.randint(0, 8192, (batch, args.tokens), generator=gen).to(device)
        globals_ = torch.randint(0, 4096, (batch, 32), generator=gen).to(device)
        reference = None
        for dtype_name, model in models.items():
            with torch.inference_mode():
                features = model.quantizer(semantic)
                speaker = model.speaker_encoder(globals_)
            for mode in modes:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                seconds, out = _time(_runner(mode, model, features, speaker), device, args.iters)
                out = out[0].float()
                if reference is None:
                    reference = out.clone()
                rtf = seconds / audio_s
                peak = (
                    torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0
                )
                print(
                    f"| {dtype_name} | {mode} | {batch} | {1000 * seconds:.2f} | {rtf:.4f} | "
                    f"{batch / rtf:.0f} | {_snr(reference, out):.1f} | {peak:.0f} |",
                    flush=True,
                )
    _window_table(models, args, device)


def _window_table(models: dict, args: argparse.Namespace, device: torch.device) -> None:
    """One streamed window per stream, decoded whole (old) and over its kept frames (new)."""
    left, emit, right = (int(v) for v in args.window.split(","))
    steps = left + emit + right
    first = next(iter(models.values()))
    emitted_s = emit * first.hop_length / first.sample_rate
    print(f"\n# one window per stream: L={left}, E={emit}, R={right} ({steps} tokens), eager")
    print("| dtype | batch | whole ms/call | kept ms/call | whole / kept | kept RTF per emitted "
          "second | kept streams/GPU | SNR kept vs whole dB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(1)
    hop = first.hop_length
    for batch in (int(b) for b in args.batches.split(",")):
        semantic = torch.randint(0, 8192, (batch, steps), generator=gen).to(device)
        globals_ = torch.randint(0, 4096, (batch, 32), generator=gen).to(device)
        keep = torch.tensor([[left, left + emit]] * batch, device=device)
        for dtype_name, model in models.items():
            with torch.inference_mode():
                features = model.quantizer(semantic)
                speaker = model.speaker_encoder(globals_)

            def whole(model=model, features=features, speaker=speaker) -> torch.Tensor:
                with torch.inference_mode():
                    return model(features, speaker)[:, left * hop : (left + emit) * hop]

            def kept(model=model, features=features, speaker=speaker, keep=keep) -> torch.Tensor:
                with torch.inference_mode():
                    return model(features, speaker, None, keep)

            t_whole, out_whole = _time(whole, device, args.iters)
            t_kept, out_kept = _time(kept, device, args.iters)
            rtf = t_kept / emitted_s
            print(
                f"| {dtype_name} | {batch} | {1000 * t_whole:.2f} | {1000 * t_kept:.2f} | "
                f"{t_whole / t_kept:.2f}x | {rtf:.4f} | {batch / rtf:.0f} | "
                f"{_snr(out_whole[0].float(), out_kept[0].float()):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
