"""Token inventories read from real tokenizers, and the BiCodec / SNAC stream parsers."""

import pytest
from tokenizers_for_tests import spark_tokenizer, veena_tokenizer

from pipecat_veena.engine.tokens import (
    MAX_STRAY_TOKENS,
    BiCodecIds,
    BiCodecParser,
    SnacIds,
    SnacParser,
)
from pipecat_veena.errors import MalformedStreamError, TokenizerError


@pytest.fixture(scope="module")
def spark_ids():
    return BiCodecIds.from_lookup(spark_tokenizer().token_to_id)


@pytest.fixture(scope="module")
def snac_ids():
    return SnacIds.from_lookup(veena_tokenizer().token_to_id)


def test_bicodec_ids_come_from_the_tokenizer(spark_ids):
    tok = spark_tokenizer()
    assert spark_ids.global_base == tok.token_to_id("<|bicodec_global_0|>")
    assert spark_ids.semantic_base + 8191 == tok.token_to_id("<|bicodec_semantic_8191|>")
    assert spark_ids.eos == tok.token_to_id("<|im_end|>")
    assert spark_ids.marker("start_global_token") == tok.token_to_id("<|start_global_token|>")


def test_tokenizer_without_codec_tokens_is_a_clear_error():
    from tokenizers_for_tests import _base

    tok = _base(["<|im_end|>"])
    with pytest.raises(TokenizerError, match=r"no '<\|bicodec_global_0\|>'.*Spark-TTS"):
        BiCodecIds.from_lookup(tok.token_to_id)
    with pytest.raises(TokenizerError, match="<custom_token_0>"):
        SnacIds.from_lookup(tok.token_to_id)


def test_non_contiguous_codec_tokens_are_rejected():
    vocab = {f"<|bicodec_global_{i}|>": 1000 + i for i in range(4096)}
    vocab["<|bicodec_global_2048|>"] = 5
    with pytest.raises(TokenizerError, match="consecutive"):
        BiCodecIds.from_lookup(vocab.get)


def test_snac_ids_match_veena_numbers_when_based_at_128256():
    ids = SnacIds(base=128256)
    assert (ids.start_of_speech, ids.end_of_speech) == (128257, 128258)
    assert (ids.start_of_human, ids.end_of_human, ids.start_of_ai) == (128259, 128260, 128261)
    assert ids.end_of_ai == 128262 and ids.audio_base == 128266


def _controllable_stream(ids, globals_, semantics):
    m = ids.markers
    return [
        m["start_acoustic_token"], m["end_acoustic_token"], m["start_global_token"],
        *ids.global_ids(globals_), m["end_global_token"], m["start_semantic_token"],
        *[ids.semantic_base + s for s in semantics], ids.eos,
    ]  # fmt: skip


def test_bicodec_parser_splits_prefix_and_semantics_in_any_delta_sizes(spark_ids):
    globals_ = list(range(100, 132))
    semantics = [5, 9, 8191, 0, 77]
    stream = _controllable_stream(spark_ids, globals_, semantics)
    for step in (1, 3, len(stream)):
        parser = BiCodecParser(spark_ids, 32)
        out = []
        for i in range(0, len(stream), step):
            out += parser.feed(stream[i : i + step])
        assert out == semantics
        assert parser.globals == globals_ and parser.done
        assert parser.prefix[-1] == spark_ids.marker("end_global_token")
        assert parser.prefix[0] == spark_ids.marker("start_acoustic_token")


def test_bicodec_parser_ignores_tokens_after_stop(spark_ids):
    parser = BiCodecParser(spark_ids, 32, prefilled=True)
    sem = spark_ids.semantic_base
    assert parser.feed([spark_ids.marker("start_semantic_token"), sem + 1, spark_ids.eos, sem]) == [
        1
    ]
    assert parser.done


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("semantic_first", "semantic token before the voice was complete"),
        ("short_globals", "ended with 31 of 32"),
        ("long_globals", "more than 32"),
        ("eos_in_prefix", "ended inside the voice prefix"),
        ("global_after", "global token after the voice prefix"),
        ("text_instead", "not codec tokens"),
    ],
)
def test_bicodec_parser_malformed_streams_are_clear_errors(spark_ids, case, message):
    ids = spark_ids
    start, end = ids.marker("start_global_token"), ids.marker("end_global_token")
    g = ids.global_ids(range(33))
    streams = {
        "semantic_first": [start, *g[:5], ids.semantic_base],
        "short_globals": [start, *g[:31], end],
        "long_globals": [start, *g[:33]],
        "eos_in_prefix": [start, *g[:3], ids.eos],
        "global_after": [start, *g[:32], end, ids.semantic_base, g[0]],
        "text_instead": [start, *g[:32], end, *([7] * (MAX_STRAY_TOKENS + 1))],
    }
    with pytest.raises(MalformedStreamError, match=message):
        BiCodecParser(ids, 32).feed(streams[case])


def test_snac_parser_checks_slot_order_and_stops(snac_ids):
    ids = snac_ids
    frame = [ids.audio_base + slot * 4096 + code for slot, code in enumerate([1, 2, 3, 4, 5, 6, 7])]
    parser = SnacParser(ids)
    assert parser.feed(frame + frame[:3]) == [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert parser.feed([ids.end_of_speech, frame[3]]) == []
    assert parser.done
    bad = SnacParser(ids)
    with pytest.raises(MalformedStreamError, match="slot 2 where slot 1 was due"):
        bad.feed([frame[0], frame[2]])


def test_snac_parser_stray_tokens_are_an_error(snac_ids):
    with pytest.raises(MalformedStreamError, match="not SNAC codes"):
        SnacParser(snac_ids).feed([3] * (MAX_STRAY_TOKENS + 1))
