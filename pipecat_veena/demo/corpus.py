"""The fixed text corpus of the demo checkpoints: English, Hindi (Devanagari) and code-mixed.

It trains the demo BPE and supplies the training texts. Changing it changes every demo byte.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

#: Longest text part (characters) the demo LLMs were trained on (72 BPE ids); written into the
#: checkpoints' voices.json so the engine splits longer text before it reaches them.
MAX_PART_CHARS = 100

CORPUS: tuple[str, ...] = (
    "Hello! Welcome to the pipecat-veena demo.",
    "The quick brown fox jumps over the lazy dog.",
    "How can I help you today?",
    "Your order number is 4521, and it will arrive on Monday.",
    "Please hold on for a moment while I check the details.",
    "I'm sorry, I didn't catch that. Could you say it again?",
    "The meeting starts at 10:30 a.m. in room B-12.",
    "Thank you for calling; have a great day!",
    "It costs $19.99 (plus tax), or about 1,650 rupees.",
    "Streaming speech should start in less than a second.",
    'She said: "this is fine" - and then she laughed.',
    "Is x < y | z > w? Only if the pipe | is escaped.",
    "Use <b>bold</b> and a|b|c as plain text, not markup.",
    "Voice agents need low latency, natural prosody and clear words.",
    "Numbers like 3.14159, 2026 and 100% are read out loud.",
    "Email me at demo@example.com or call +91 98765 43210.",
    "नमस्ते! आप कैसे हैं?",
    "मेरा नाम वीणा है और मैं आपकी मदद करूँगी।",
    "आज मौसम बहुत अच्छा है।",
    "कृपया एक पल रुकिए, मैं जानकारी देख रही हूँ।",
    "भारत एक विशाल और विविधताओं से भरा देश है।",
    "धन्यवाद, आपका दिन शुभ हो।",
    "क्या आप मेरी बात सुन पा रहे हैं?",
    "हमारी ट्रेन सुबह सात बजे दिल्ली से चलेगी।",
    "बच्चे पार्क में खेल रहे हैं और पक्षी गा रहे हैं।",
    "यह आवाज़ एक डेमो है, असली शब्द नहीं।",
    "मुझे हिंदी और अंग्रेज़ी दोनों पसंद हैं।",
    "आपका ऑर्डर कल तक पहुँच जाएगा।",
    "नमस्ते! Welcome to the demo.",
    "आज का meeting बहुत productive था।",
    "Please मुझे कल call करना, okay?",
    "मेरा phone number 98765 है, please note कर लीजिए।",
    "Traffic बहुत ज़्यादा है, so I'll be late by 10 minutes.",
    "यह app बहुत fast है और इसकी voice quality अच्छी है।",
    "Let's meet at the कॉफ़ी shop near the station.",
    "Weekend पर हम Goa जा रहे हैं!",
    "Sir, आपका refund process हो गया है।",
    "Kya aap mujhe sun sakte hain? Main theek hoon.",
    "Hum kal subah 9 baje milenge, theek hai?",
    "A, B, C; 1, 2, 3... done!",
    "Wait -- what? Really?! Yes.",
    "Prices: 5 kg @ 40/kg = 200; total ~250.",
)


class TextSampler:
    """Draws training texts as BPE ids, encoded the way the engine encodes user text.

    Half are spans of ``CORPUS`` lines (sometimes two lines, sometimes with an inline tag), the
    rest random BPE ids (so that every BPE id is seen), some of them with many repeats. Lengths
    favour short texts with a tail up to ``max_tokens``.

    Args:
        encode: text -> BPE ids (no added tokens).
        num_bpe: the BPE's size (random texts draw ids below it).
        max_tokens: longest text in ids.
        tag_ids: inline tag ids (emotion tags) that may appear between words.
        lead: put before each corpus text (Veena's prompt has a space after the speaker tag).
    """

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        *,
        num_bpe: int,
        max_tokens: int,
        tag_ids: Sequence[int] = (),
        lead: str = "",
    ) -> None:
        self._encode = encode
        self._num_bpe = num_bpe
        self._max = max_tokens
        self._tags = tuple(tag_ids)
        self._lead = lead
        self._lines = [line.split(" ") for line in CORPUS]

    def length(self, rng: random.Random) -> int:
        """A text length in ids: mostly short, some up to ``max_tokens``."""
        if rng.random() < 0.6:
            return rng.randint(1, min(24, self._max))
        return rng.randint(1, self._max)

    def __call__(self, rng: random.Random) -> list[int]:
        """One text as ids (1 to ``max_tokens`` of them)."""
        n = self.length(rng)
        kind = rng.random()
        if kind < 0.35:
            return [rng.randrange(self._num_bpe) for _ in range(n)]
        if kind < 0.5:
            # Few distinct ids, so ids repeat (doubled letters, "...", "!!"): copying must
            # look at the id before, not only at the id itself.
            alphabet = [rng.randrange(self._num_bpe) for _ in range(rng.randint(2, 8))]
            return [rng.choice(alphabet) for _ in range(n)]
        words = list(rng.choice(self._lines))
        if rng.random() < 0.3:
            words += rng.choice(self._lines)
        start = rng.randrange(len(words))
        words = words[start : start + rng.randint(1, len(words))]
        ids: list[int] = []
        if self._tags and rng.random() < 0.15:
            cut = rng.randint(0, len(words))
            head, tail = " ".join(words[:cut]), " ".join(words[cut:])
            ids += self._encode(self._lead + head + " ") if head else []
            ids.append(rng.choice(self._tags))
            ids += self._encode(" " + tail) if tail else []
        else:
            ids = self._encode(self._lead + " ".join(words))
        return ids[:n] if n < len(ids) else ids
