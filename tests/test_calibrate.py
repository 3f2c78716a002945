"""Seam calibration on a real torch codec (BiCodec, tiny config, random weights)."""

from __future__ import annotations

import pytest

from pipecat_veena.codecs.bicodec import BiCodecCodec, write_random_checkpoint
from pipecat_veena.engine.calibrate import (
    calibrate_lookahead,
    lookahead_curve,
    pick_lookahead,
    seam_snr,
)
from pipecat_veena.streaming import StreamConfig


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    return BiCodecCodec.from_pretrained(
        write_random_checkpoint(tmp_path_factory.mktemp("bicodec"), "tiny", seed=3)
    )


def test_seams_are_exact_with_full_context_and_worse_without(codec):
    full = StreamConfig(first_frames=4, lookahead_frames=codec.context_frames, growth=2.0)
    assert seam_snr(codec, full, frames=120) > 100
    none = StreamConfig(first_frames=4, lookahead_frames=0, growth=2.0)
    assert seam_snr(codec, none, frames=120) < 60


def test_calibration_picks_the_smallest_lookahead_meeting_the_target(codec):
    candidates = [0, 2, 4, 8, 16, codec.context_frames]
    curve = dict(lookahead_curve(codec, candidates, frames=120))
    chosen = calibrate_lookahead(codec, 80.0, candidates=candidates, frames=120)
    r = chosen.lookahead_frames
    assert curve[r] >= 80.0
    assert all(curve[c] < 80.0 for c in candidates if c < r)
    assert chosen.first_frames == StreamConfig.for_codec(codec).first_frames


def test_pick_lookahead_falls_back_to_the_largest():
    assert pick_lookahead([(4, 30.0), (8, 85.0), (16, 120.0)], 80.0) == 8
    assert pick_lookahead([(4, 30.0), (8, 40.0)], 80.0) == 8
