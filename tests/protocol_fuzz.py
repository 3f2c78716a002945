"""Malformed input for the speech server: WebSocket messages and HTTP request bodies.

Every case is built to be invalid (bad JSON, wrong types, unknown types, ids, voices, fields,
values out of range, binary frames, oversized or deeply nested JSON, lone surrogates, NaN and
Infinity, huge seeds and top_k, odd rates), so the server must answer each one with an error;
a refused ``speak`` with a string id ends that id (``ended: true``). ``HOSTILE_TEXTS`` are valid
but awkward texts (markdown, non-ASCII spaces, invisible characters) that must be spoken or
refused with a clear error, never crash. Used by tests/test_server_unit.py and by
benchmarks/serve.py (which reports the count).
"""

from __future__ import annotations

import json
import math
import random

#: JSON values of every type, for the wrong-type cases.
_WRONG = [0, -1, 2.5, True, None, [], [1, "a"], {}, {"x": 1}, "", "x" * 3]
#: Sampling values no request may carry (json.dumps writes NaN and Infinity as JSON parsers
#: such as Python's and many others read them).
_BAD_SAMPLING = {
    "temperature": [math.nan, math.inf, -math.inf, 2.0001],
    "top_p": [math.nan, math.inf, 0.0, -0.5],
    "repetition_penalty": [math.nan, math.inf, -math.inf, 0, -1.5],
    "top_k": [10**29, -5, -(2**63), 2**31],
    "seed": [2**64, 2**70, -1, -(2**70)],
    "max_tokens": [0, -3],
}
#: Output rates no request may ask for (out of range, fractional, not finite).
_BAD_RATES = [
    0,
    100,
    7999,
    47999,
    44101,
    48001,
    96000,
    -8000,
    16000.5,
    10**30,
    math.nan,
    math.inf,
    True,
]
#: Valid but awkward texts: markdown, non-ASCII spaces (NBSP, narrow NBSP, em and thin spaces)
#: before full stops and in numbers, invisible characters, emoji only, mixed scripts.
HOSTILE_TEXTS = [
    "Delivery in **48** hours.",
    "# Order\n- **Total:** `Rs. 1,299`\n- _ETA_: [Monday](http://example.com)",
    "Pay Rs.\u00a0500\u202f.",
    "Call 100\u2003or 112\u2009.",
    "OTP\u00a048\u00a029\u00a013 .",
    "नमस्ते\u00a0। आपका ऑर्डर\u202f**48** घंटे में।",
    "\u200b\u200d\u2060Hello\u200b.",
    "\u202eRTL override\u202c then text.",
    "🙂🙂🙂",
    "***",
    "Dr.\u00a0Rao, a.m.\u00a0Rs.\u00a05.",
]


def _garbage(rng: random.Random, n: int) -> str:
    return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(n))


def ws_cases(rng: random.Random, count: int) -> list[str | bytes]:
    """``count`` malformed WebSocket messages (text frames as str, binary frames as bytes)."""
    makers = [
        lambda: rng.randbytes(rng.randrange(1, 64)),
        lambda: "{" + _garbage(rng, rng.randrange(1, 40)),
        lambda: json.dumps(rng.choice([1, "speak", [{"type": "speak"}], None, 3.5]))[:-1] + "]",
        lambda: json.dumps(rng.choice([1, "speak", [{"type": "speak"}], None, 3.5])),
        lambda: json.dumps({"type": rng.choice(["", "SPEAK", "say", "ping", 7, None]), "id": "f"}),
        lambda: json.dumps({"id": "f", "text": "hello"}),
        lambda: json.dumps(
            {
                "type": "speak",
                "id": rng.choice(_WRONG[:6] + ["a b", "x" * 65, "é"]),
                "text": "Hello.",
            }
        ),  # fmt: skip
        lambda: json.dumps({"type": "speak", "id": "f", "text": rng.choice(_WRONG[:-2])}),
        lambda: json.dumps(
            {
                "type": "speak",
                "id": "f",
                "text": "Hi",
                rng.choice(["voice", "options", "sample_rate", "final", "words"]): rng.choice(
                    [[1], {"a": [1]}, "nope", 1.5]
                ),
            }
        ),  # fmt: skip
        lambda: json.dumps(
            {"type": "speak", "id": "f", "text": "Hi", "voice": "robot-" + str(rng.randrange(1000))}
        ),  # fmt: skip
        lambda: json.dumps(
            {
                "type": "speak",
                "id": "f",
                "text": "Hi",
                "options": {
                    rng.choice(["temperature", "top_p", "top_k", "seed", "max_tokens"]): rng.choice(
                        ["hot", [1], {"a": 1}, True]
                    )
                },
            }
        ),  # fmt: skip
        lambda: json.dumps(
            {
                "type": "speak",
                "id": "f",
                "text": "Hi",
                "options": {"temperature": rng.choice([-1, 2.5, 99])},
            }
        ),  # fmt: skip
        lambda: json.dumps({"type": "speak", "id": "f", "text": "Hi", "options": {"top_p": 0}}),
        lambda: json.dumps({"type": "speak", "id": "f", "text": "Hi", "options": {"warp": 9}}),
        lambda: json.dumps(
            {
                "type": "speak",
                "id": "f",
                "text": "Hi",
                "sample_rate": rng.choice([0, 100, 96000, -8000]),
            }
        ),  # fmt: skip
        lambda: json.dumps({"type": "speak", "id": "f", "text": "Hi", "speed": 2}),
        lambda: json.dumps({"type": "speak", "id": "f", "text": "y" * 5000}),
        lambda: json.dumps({"type": "speak", "id": "f", "text": "Hi \ud800 there"}),
        lambda: json.dumps(
            {
                "type": "speak",
                "id": "f",
                "text": rng.choice(HOSTILE_TEXTS),
                "options": {(k := rng.choice(list(_BAD_SAMPLING))): rng.choice(_BAD_SAMPLING[k])},
            }
        ),  # fmt: skip
        lambda: json.dumps(
            {"type": "speak", "id": "f", "text": "Hi", "sample_rate": rng.choice(_BAD_RATES)}
        ),  # fmt: skip
        lambda: json.dumps(
            {
                "type": "speak",
                "id": "f",
                "text": "Hi",
                **rng.choice(
                    [
                        {"voice": "fe\udc80male"},
                        {"options": {"language": "h\ud83d"}},
                        {"text": "\udbff"},
                        {"id": "f\ud800"},
                    ]
                ),
            }
        ),  # fmt: skip
        lambda: json.dumps(
            {
                "type": rng.choice(["append", "flush", "end", "append"]),
                "id": f"none-{rng.randrange(99)}",
                "text": "x",
            }
        ),  # fmt: skip
        lambda: json.dumps({"type": "append", "id": "none", "text": "x"}),
        lambda: json.dumps({"type": "append", "id": "f", "text": rng.choice(_WRONG[:-2])}),
        lambda: json.dumps({"type": "cancel", "id": "f", "extra": True}),
        lambda: "[" * 20000 + "]" * 20000,
        lambda: json.dumps({"type": "speak", "id": "f", "text": "a" * 70000}),
    ]
    return [rng.choice(makers)() for _ in range(count)]


def http_cases(rng: random.Random, count: int) -> list[tuple[str, str, bytes]]:
    """``count`` malformed requests to the OpenAI routes: (method, path, body)."""
    good = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "pcm"}

    def broken() -> dict:
        body = dict(good)
        field = rng.choice(
            ["input", "voice", "response_format", "speed", "stream_format", "sample_rate",
             "temperature", "top_k", "seed", "repetition_penalty", "model", "instructions"]
        )  # fmt: skip
        body[field] = {
            "input": rng.choice([None, 3, ["x"], "", "...", "x" * 5000, "\ud800"]),
            "voice": rng.choice([3, ["alloy"], "robot", {"id": 4}]),
            "response_format": rng.choice(["ogg", "m4a", "vorbis", 3, "PCM16"]),
            "speed": rng.choice([0.25, 2.5, "fast", True, 4.0]),
            "stream_format": rng.choice(["chunks", 1, "SSE"]),
            "sample_rate": rng.choice(["24000", 200000, *_BAD_RATES]),
            "temperature": rng.choice([-0.5, 3, "warm", [1], *_BAD_SAMPLING["temperature"]]),
            "top_k": rng.choice([1.5, "ten", True, *_BAD_SAMPLING["top_k"]]),
            "seed": rng.choice(_BAD_SAMPLING["seed"]),
            "repetition_penalty": rng.choice(_BAD_SAMPLING["repetition_penalty"]),
            "model": rng.choice([5, ["tts-1"], {"id": 1}]),
            "instructions": rng.choice([5, ["calm"], {"a": 1}]),
        }[field]
        if field == "input" and body["input"] is None:
            del body["input"]
        return body

    makers = [
        lambda: ("POST", "/v1/audio/speech", json.dumps(broken()).encode()),
        lambda: ("POST", "/v1/audio/speech", rng.randbytes(rng.randrange(0, 80))),
        lambda: ("POST", "/v1/audio/speech", b"{" + _garbage(rng, 30).encode()),
        lambda: ("POST", "/v1/audio/speech", json.dumps([good]).encode()),
        lambda: ("POST", "/v1/audio/speech", b"[" * 20000 + b"]" * 20000),
        lambda: ("POST", "/v1/audio/speech", json.dumps({**good, "input": "z" * 70000}).encode()),
        lambda: ("GET", "/v1/audio/speech", b""),
        lambda: ("POST", "/v1/audio/voices", b"{}"),
        lambda: ("POST", f"/v1/audio/{_garbage(rng, 3).encode().hex()}", b"{}"),
    ]
    return [rng.choice(makers)() for _ in range(count)]
