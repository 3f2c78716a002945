"""The repetition guard trips on loops and drones, never on varied streams, and where it trips
depends only on the codes, not on how they arrive."""

import numpy as np
import pytest

from pipecat_veena.engine.guards import RepetitionGuard


def _stream(seed: int) -> list[int]:
    """200 random codes, then a five-code loop."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 8192, 200).tolist() + [11, 12, 13, 14, 15] * 60


def _kept(guard: RepetitionGuard, codes: list[int], sizes: list[int]) -> list[int]:
    """Feed ``codes`` in pieces of the given sizes (cycled); return what the guard kept."""
    kept, i, n = [], 0, 0
    while i < len(codes):
        piece = codes[i : i + sizes[n % len(sizes)]]
        kept += piece[: guard.feed(piece)]
        i, n = i + len(piece), n + 1
    return kept


def test_trips_on_a_short_loop():
    guard = RepetitionGuard(window=150, max_period=25)
    codes = _stream(0)
    kept = _kept(guard, codes, [5])
    assert guard.tripped and guard.period == 5
    # the first check whose window is all loop: 200 + 150 codes, rounded up to a check
    assert len(kept) == 352 and kept == codes[:352]
    assert guard.feed([1, 2, 3]) == 0  # tripped: nothing more is kept


def test_the_cut_does_not_depend_on_how_codes_arrive():
    codes = _stream(1)
    cuts = set()
    for sizes in ([1], [7], [16], [3, 40, 1], [500], [13, 2, 29]):
        guard = RepetitionGuard(window=150, max_period=25)
        cuts.add(len(_kept(guard, codes, sizes)))
        assert guard.period == 5
    assert cuts == {352}


def test_checks_fall_on_whole_frames():
    guard = RepetitionGuard(window=147, max_period=21, check_every=21)  # 7 codes a frame
    kept = _kept(guard, [5] * 400, [9])
    assert guard.period == 1 and len(kept) == 147 and len(kept) % 7 == 0


def test_trips_on_a_drone():
    guard = RepetitionGuard(window=100, max_period=10)
    assert any(guard.feed([42]) == 0 for _ in range(200))
    assert guard.period == 1 and guard.tripped


def test_random_codes_never_trip():
    guard = RepetitionGuard(window=150, max_period=25)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        codes = rng.integers(0, 8192, 7).tolist()
        assert guard.feed(codes) == 7
    assert not guard.tripped


def test_bad_parameters():
    with pytest.raises(ValueError, match="max_period"):
        RepetitionGuard(window=10, max_period=10)
    with pytest.raises(ValueError, match="check_every"):
        RepetitionGuard(window=10, max_period=5, check_every=0)


# -- guards of other packages' private state (pipecat_veena.logs.degrade_once) --------------
# These fail loudly when the installed Pipecat or Ray no longer has the shape this package
# reads, so an upgrade is noticed here, not by a production trace or drain that silently stops.


async def test_the_installed_pipecat_keeps_tts_spans_where_the_guard_reads_them(monkeypatch):
    """A real Pipecat pipeline with tracing on: ``VeenaTTSService`` finds Pipecat's own ``tts``
    span in its private ``_tts_spans`` (else the engine's spans stop nesting under it)."""
    from otel import collect, pipeline_says
    from server_fakes import FakeSpeechEngine

    from pipecat_veena import logs, tracing

    found = []
    guarded = tracing.pipecat_tts_span

    def watch(service, context_id):
        found.append(guarded(service, context_id))
        return found[-1]

    monkeypatch.setattr(tracing, "pipecat_tts_span", watch)

    class Engine(FakeSpeechEngine):
        def check_options(self, **options):  # the service sends None for "the default"
            return super().check_options(**{k: v for k, v in options.items() if v is not None})

    engine = Engine()
    await engine.start()
    with collect() as spans:
        assert await pipeline_says(engine, "Finding the span.") > 0
    (tts,) = [s for s in spans.get_finished_spans() if s.name == "tts"]
    assert found and all(span is not None for span in found), (
        "the installed Pipecat no longer keeps its tts spans in TTSService._tts_spans as "
        "{context_id: {'span': span}}: update pipecat_veena.tracing.pipecat_tts_span"
    )
    assert found[0].get_span_context().span_id == tts.context.span_id
    assert "pipecat._tts_spans" not in logs.degraded()


@pytest.mark.parametrize("spans", [None, [], {"ctx": ("span",)}, {"ctx": {"Span": 1}}])
def test_a_changed_pipecat_tts_spans_degrades_with_one_warning(spans, monkeypatch, caplog_loguru):
    from pipecat_veena import logs, tracing

    monkeypatch.setattr(logs, "_degraded", set())

    class Service:
        pass

    service = Service()
    if spans is not None:
        service._tts_spans = spans
    assert tracing.pipecat_tts_span(service, "ctx") is None
    assert tracing.pipecat_tts_span(service, "ctx") is None
    assert logs.degraded() == {"pipecat._tts_spans"}
    assert caplog_loguru.text.count("no longer keeps its tts spans") == 1
    # a dict without this context's entry is no change: nothing to nest under, no warning
    service._tts_spans = {}
    monkeypatch.setattr(logs, "_degraded", set())
    assert tracing.pipecat_tts_span(service, "ctx") is None and not logs.degraded()


def test_the_installed_ray_has_the_replica_shutdown_the_drain_wraps():
    pytest.importorskip("ray.serve")
    from ray.serve._private.replica import Replica

    from pipecat_veena.deploy.ray import replica_shutdown_problem

    assert replica_shutdown_problem(Replica) is None, (
        "the installed Ray Serve changed Replica.perform_graceful_shutdown: replicas would "
        "not drain; update pipecat_veena.deploy.ray.on_replica_stop"
    )


def test_a_changed_ray_replica_shutdown_degrades_with_one_warning(monkeypatch, caplog_loguru):
    pytest.importorskip("ray.serve")
    import ray.serve._private.replica as replica_module

    from pipecat_veena import logs
    from pipecat_veena.deploy import ray as deploy_ray

    class NoMethod:
        pass

    class Sync:
        def perform_graceful_shutdown(self):
            pass

    class TakesMore:
        async def perform_graceful_shutdown(self, timeout_s):
            pass

    class Fine:
        async def perform_graceful_shutdown(self, wait: bool = True):
            pass

    assert "no Replica" in deploy_ray.replica_shutdown_problem(NoMethod)
    assert "not a coroutine" in deploy_ray.replica_shutdown_problem(Sync)
    assert "other arguments" in deploy_ray.replica_shutdown_problem(TakesMore)
    assert deploy_ray.replica_shutdown_problem(Fine) is None

    monkeypatch.setattr(logs, "_degraded", set())
    monkeypatch.setattr(replica_module, "Replica", TakesMore)
    monkeypatch.setattr(deploy_ray, "_STOP_HOOKS", [])

    async def hook() -> None:
        pass

    assert deploy_ray.on_replica_stop(hook) is False
    assert deploy_ray.on_replica_stop(hook) is False
    assert not deploy_ray._STOP_HOOKS  # the feature is off: nothing installed
    assert caplog_loguru.text.count("will not drain") == 1
