"""Exception types of pipecat_veena: each message names the problem and the fix."""


class VeenaError(Exception):
    """Base class of every error this package raises on purpose."""


class CheckpointError(VeenaError, ValueError):
    """A checkpoint directory or file is missing, unreadable or has the wrong contents."""


class TokenizerError(CheckpointError):
    """The tokenizer lacks tokens the model format needs (codec ids, control tokens)."""


class UnknownVoiceError(VeenaError, ValueError):
    """A voice name that the loaded checkpoint does not offer."""


class EnrolmentError(VeenaError, ValueError):
    """A voice cannot be enrolled (bad clip, bad or taken name, no speaker encoder).

    Attributes:
        code: what kind of problem: ``BAD_CLIP``, ``BAD_NAME``, ``NAME_TAKEN``,
            ``NOT_OWNER`` (a shared voice its caller does not own), ``TOO_MANY_VOICES`` (the
            cap on enrolled voices) or ``UNSUPPORTED`` (the model cannot enrol); the speech
            server's error code.
    """

    BAD_CLIP = "bad_voice_clip"
    BAD_NAME = "bad_voice_name"
    NAME_TAKEN = "voice_name_taken"
    NOT_OWNER = "voice_not_owned"
    TOO_MANY_VOICES = "too_many_voices"
    UNSUPPORTED = "enrolment_unsupported"

    def __init__(self, message: str, *, code: str = BAD_CLIP) -> None:
        super().__init__(message)
        self.code = code


class MalformedStreamError(VeenaError):
    """The LLM's token stream broke the codec grammar (e.g. semantics before globals)."""


class NoAudioError(VeenaError):
    """Non-empty, speakable text produced no audio."""


class GenerationError(VeenaError, RuntimeError):
    """One generation request failed in the LLM backend (the backend itself is still alive)."""


class EngineNotRunningError(VeenaError, RuntimeError):
    """The engine was used before ``start()`` or after ``shutdown()``."""


class EngineStartError(VeenaError, RuntimeError):
    """The engine cannot start as called (e.g. from the unguarded top level of a script)."""


class EngineDeadError(VeenaError, RuntimeError):
    """The generation backend died under a request, or is down.

    Attributes:
        retryable: True (the default) while the engine restarts its backend: the same request
            may succeed shortly (``VeenaEngine.wait_running``) or on another server; False once
            the engine gave up restarting it (``VeenaEngine.state`` is "failed").
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class RemoteError(VeenaError):
    """A speech server (``pipecat-veena serve``) refused or failed a request.

    Attributes:
        code: the protocol's stable error code (see docs/protocol.md).
        retryable: True when the same request may succeed on a retry (another server, later).
    """

    def __init__(self, message: str, *, code: str = "internal", retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class ServerUnavailableError(RemoteError):
    """No speech server could take the request: unreachable, restarting, draining or full."""

    def __init__(self, message: str, *, code: str = "server_unavailable") -> None:
        super().__init__(message, code=code, retryable=True)
