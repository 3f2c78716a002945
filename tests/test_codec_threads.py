"""Small codec calls run on one torch thread on a CPU; everything else on all of them.

Real tiny BiCodec, real torch: the thread count is read inside the decode itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipecat_veena.codecs.base import CodecWindow
from pipecat_veena.codecs.threads import intra_op_threads


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory):
    from pipecat_veena.codecs.bicodec import BiCodecCodec, write_random_checkpoint

    directory: Path = tmp_path_factory.mktemp("bicodec_threads")
    return BiCodecCodec.from_pretrained(write_random_checkpoint(directory, "tiny", seed=3))


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _window(frames: int, keep: tuple[int, int]) -> CodecWindow:
    rng = np.random.default_rng(frames)
    return CodecWindow(
        frames=rng.integers(0, 8192, size=(frames, 1)),
        condition=rng.integers(0, 4096, size=32),
        keep=keep,
    )


def _threads_inside(codec, windows: list[CodecWindow]) -> int:
    seen = []
    decode = codec.decoder.decode

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return decode(*args, **kwargs)

    codec.decoder.decode = spy
    try:
        codec.decode_windows(windows)
    finally:
        del codec.decoder.decode  # the instance attribute; the method shows again
    return seen[0]


@pytest.mark.usefixtures("two_threads")
def test_a_streams_first_windows_run_on_one_thread_and_the_rest_on_all(codec) -> None:
    assert codec.single_thread_frames == 8
    assert _threads_inside(codec, [_window(20, (0, 4))]) == 1  # the first window alone
    assert _threads_inside(codec, [_window(20, (0, 4)), _window(28, (4, 8))]) == 1  # 8 in all
    assert _threads_inside(codec, [_window(28, (4, 12)), _window(20, (0, 4))]) == 2  # 12
    assert _threads_inside(codec, [_window(44, (12, 28))]) == 2
    assert torch.get_num_threads() == 2  # restored after each call


@pytest.mark.usefixtures("two_threads")
def test_the_thread_count_comes_back_after_a_failed_call(codec) -> None:
    with pytest.raises(ValueError, match="condition must hold"):
        codec.decode_windows([CodecWindow(frames=np.zeros((4, 1), dtype=np.int64))])
    bad = _window(20, (0, 4))
    bad.frames[0, 0] = 9999  # out of the codebook: refused inside the decode
    with pytest.raises(ValueError):
        codec.decode_windows([bad])
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_intra_op_threads_only_ever_lowers_the_count() -> None:
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    with intra_op_threads(4), intra_op_threads(None):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2
