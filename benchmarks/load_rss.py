"""Peak-RSS growth of loading a BiCodec checkpoint, in a fresh process.

    python -m benchmarks.load_rss BICODEC_DIR    -> prints "<bytes grown> <bytes of weights>"

Used by benchmarks/codec_cpu.py and by the loader test that checks one copy of the weights.
"""

from __future__ import annotations

import sys

from pipecat_veena.codecs.bicodec import BiCodecDecoder


def peak_rss() -> int:
    """This process's peak RSS in bytes (VmHWM; ru_maxrss would include the parent's via exec)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


if __name__ == "__main__":
    before = peak_rss()
    model = BiCodecDecoder.from_pretrained(sys.argv[1])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(peak_rss() - before, weights)
