"""The generation contract: what the engine needs from an LLM backend."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pipecat_veena.generation.grammar import Grammar
from pipecat_veena.generation.lora import LoraAdapter

#: Largest ``top_k`` (vLLM keeps it as an int32; any k above the vocabulary means all tokens).
MAX_TOP_K = 2**31 - 1
#: Largest request ``seed`` (a signed 64-bit integer; each part of a request adds its index,
#: wrapping past this to 0).
MAX_SEED = 2**63 - 1
#: The range of ``repetition_penalty``. vLLM applies it in float32 after the grammar's mask:
#: a penalty that rounds to 0 in float32 (1e-300) turns each masked id's -inf into NaN, and
#: one that rounds to inf (1e300) turns a zero logit into NaN, so sampling picks forbidden ids.
#: Inside this range every product stays finite (logits times 1e9 is far from float32's 3e38).
MIN_REPETITION_PENALTY = 1e-9
MAX_REPETITION_PENALTY = 1e9


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling settings of one generation request.

    Parameters:
        temperature: softmax temperature in [0, 2]; 0 means greedy.
        top_k: keep the k most likely tokens (0 or -1 disables).
        top_p: nucleus mass to keep.
        repetition_penalty: > 1 discourages repeating tokens (1.0 disables); in
            [``MIN_REPETITION_PENALTY``, ``MAX_REPETITION_PENALTY``].
        min_tokens: the stop ids are suppressed until this many tokens exist.
        max_tokens: hard cap on generated tokens (the runaway cap).
        seed: per-request seed for reproducible sampling (None: random).
        stop_token_ids: ids that end the request; the stop id is included in the output.
        grammar: the codec grammar every generated id must follow (a backend that supports it
            masks the ids it forbids; None: unconstrained).
        adapter: the LoRA adapter to generate with (a fine-tuned voice; None: the base model).
    """

    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    max_tokens: int = 2048
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    grammar: Grammar | None = None
    adapter: LoraAdapter | None = None

    def __post_init__(self) -> None:
        # The one check of every sampling value (WebSocket options, the OpenAI route, the
        # Pipecat and LiveKit settings, the remote engine): a value vLLM would refuse or fail on
        # later is refused here, naming the accepted range. NaN fails every comparison below.
        _check_range("temperature", self.temperature, 0.0 <= self.temperature <= 2.0, "in [0, 2]")
        _check_range("top_p", self.top_p, 0.0 < self.top_p <= 1.0, "in (0, 1]")
        _check_range(
            "repetition_penalty",
            self.repetition_penalty,
            MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
            f"a finite number > 0 in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] "
            "(1 disables)",
        )
        _check_range(
            "top_k",
            self.top_k,
            -1 <= self.top_k <= MAX_TOP_K,
            f"an int in [-1, {MAX_TOP_K}] (0 or -1 disables)",
        )
        if self.seed is not None:
            _check_range(
                "seed", self.seed, 0 <= self.seed <= MAX_SEED, f"an int in [0, {MAX_SEED}]"
            )
        if self.max_tokens < 1 or self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError(
                f"need 0 <= min_tokens <= max_tokens and max_tokens >= 1, "
                f"got min_tokens={self.min_tokens}, max_tokens={self.max_tokens}"
            )


def _check_range(name: str, value: object, ok: bool, accepted: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


@dataclass(frozen=True)
class TokenDelta:
    """New token ids of one request since the previous delta.

    Attributes:
        token_ids: the new ids (a stop id, when hit, is the last one).
        finish_reason: None while running; then "stop", "length" or "abort".
    """

    token_ids: tuple[int, ...]
    finish_reason: str | None = None


class TokenGenerator(ABC):
    """An LLM backend shared by every request of one process.

    ``generate`` is an async iterator; closing or cancelling it aborts the request in the backend
    at once, so that no tokens are generated for a listener that left.
    """

    @abstractmethod
    async def start(self) -> None:
        """Load the model; idempotent."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the backend and every process it started; idempotent, safe when half-built."""

    @abstractmethod
    def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        """Stream the new token ids of one request."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort one request (no-op when it already finished)."""

    @abstractmethod
    def num_unfinished(self) -> int:
        """Requests the backend still holds (running, queued or not yet reaped)."""

    @property
    @abstractmethod
    def is_running(self) -> bool:
        """True between a successful ``start`` and ``shutdown``, while the backend is healthy."""

    @property
    def was_shut_down(self) -> bool:
        """True once ``shutdown`` was called on purpose (a signal, the exit hook, the owner).

        It tells a backend that was stopped from one that died (the engine restarts only those).
        """
        return False
