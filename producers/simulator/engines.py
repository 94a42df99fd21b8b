"""The engines of the simulator (continuous batching, restarts, stats): see
:mod:`producers.simulator.model`."""

from __future__ import annotations

import heapq
from typing import Any

from pipeline.contract.events import EngineFinished, EngineStats
from producers.simulator.state import (
    _K_CUTOFF,
    _K_QUEUE_TIMEOUT,
    _K_STATS,
    _K_WAKE,
    _PENDING,
    _RUNNING,
    _WAITING,
    SimCore,
    _Engine,
    _r,
    _Req,
)


class EngineLoop(SimCore):
    """Engines: a request reaches one, waits, runs, finishes; stats every interval."""

    def _on_engine_arrival(self, req: _Req) -> None:
        if req.state != _PENDING:
            return  # the client left before the request reached the engine
        now = self._now_ms
        ids = self._engines_of_model[req.model_idx]
        start = self._rr[req.model_idx]
        self._rr[req.model_idx] = (start + 1) % len(ids)
        best = ids[start]
        best_load = self._engines[best].running + self._engines[best].waiting_live
        for k in range(1, len(ids)):
            cand = ids[(start + k) % len(ids)]
            e = self._engines[cand]
            load = e.running + e.waiting_live
            if load < best_load:
                best, best_load = cand, load
        eng = self._engines[best]
        req.engine = best
        req.t_engine_ms = now
        req.state = _WAITING
        eng.queues[req.priority if self._by_priority else 0].append(req)
        eng.waiting_live += 1
        if self._cfg.max_queue_ms is not None:
            self._push(now + self._cfg.max_queue_ms, _K_QUEUE_TIMEOUT, req)
        if req.cutoff_ms is not None and req.priority > 0:
            self._push(now + req.cutoff_ms, _K_CUTOFF, req)
        if not eng.active:
            self._schedule_wake(eng, eng.iter_idx, now)
        elif eng.running < eng.model.max_concurrency:
            j = eng.next_boundary(now)
            self._schedule_wake(eng, j, eng.boundary_ms(j))

    def _on_ready(self, eng: _Engine) -> None:
        """A restarted engine finished loading: admit what waited for it."""
        if not eng.waiting_live:
            return
        if not eng.active:
            self._schedule_wake(eng, eng.iter_idx, self._now_ms)
        elif eng.running < eng.model.max_concurrency:
            j = eng.next_boundary(self._now_ms)
            self._schedule_wake(eng, j, eng.boundary_ms(j))

    def _schedule_wake(self, eng: _Engine, j: int, t_ms: float) -> None:
        if eng.wake_iter != -1 and eng.wake_iter <= j:
            return
        eng.wake_version += 1
        eng.wake_iter = j
        self._push(t_ms, _K_WAKE, eng, eng.wake_version)

    def _drop_running(self, eng: _Engine, req: _Req, now: float) -> None:
        """Take a running request off its engine (finish-heap entry is deleted lazily)."""
        eng.account(now)
        eng.running -= 1
        eng.running_prompt_tokens -= req.prompt_tokens
        eng.running_admit_iter_sum -= req.admit_iter
        if eng.active:
            j = eng.next_boundary(now)
            self._schedule_wake(eng, j, eng.boundary_ms(j))

    def _on_wake(self, eng: _Engine) -> None:
        now = self._now_ms
        j = eng.wake_iter
        eng.wake_iter = -1
        eng.account(now)
        eng.iter_idx = j
        model = eng.model
        heap = eng.finish_heap
        while heap and heap[0][0] <= j - 1:
            _f, _o, req = heapq.heappop(heap)
            if req.state != _RUNNING:
                continue  # aborted while running (lazy deletion)
            eng.running -= 1
            eng.running_prompt_tokens -= req.prompt_tokens
            eng.running_admit_iter_sum -= req.admit_iter
            self._finish(eng, req, now)
        admitted: list[_Req] = []
        prefill_tokens = 0
        loading = now < eng.ready_ms  # restarted, weights loading: no admissions
        queues = eng.queues
        q = 0  # the queue admitted from: lowest priority level first (one queue in fcfs)
        while not loading and eng.running < model.max_concurrency:
            while q < len(queues) and not queues[q]:
                q += 1
            if q == len(queues):
                break
            req = queues[q].popleft()
            if req.state != _WAITING:
                continue
            eng.waiting_live -= 1
            req.state = _RUNNING
            req.t_sched_ms = now
            req.admit_iter = j
            eng.running += 1
            eng.running_prompt_tokens += req.prompt_tokens
            eng.running_admit_iter_sum += j
            prefill_tokens += req.prompt_tokens - req.cached_tokens
            eng.hit_cached += req.cached_tokens
            eng.hit_prompt += req.prompt_tokens
            admitted.append(req)
        if eng.running == 0:
            eng.active = False
            return
        eng.active = True
        eng.seg_start_ms = now
        eng.seg_iter = j
        eng.seg_step_ms = model.step_ms(eng.running)
        eng.seg_first_ms = eng.seg_step_ms + model.prefill_ms_per_token * prefill_tokens
        t_first = now + eng.seg_first_ms
        for req in admitted:
            req.t_first_ms = t_first
            if req.forwarded is not None and req.stream:  # its gateway sees the first byte
                self._first_byte_at(t_first + req.post_ms, req)
            last = req.stop_after if req.stop_after else req.gen_tokens
            heapq.heappush(heap, (j + last - 1, self._order, req))
            self._order += 1
        while heap and heap[0][2].state != _RUNNING:
            heapq.heappop(heap)
        if heap:
            nxt = heap[0][0] + 1
            self._schedule_wake(eng, nxt, eng.boundary_ms(nxt))

    def _finish(self, eng: _Engine, req: _Req, now: float) -> None:
        """A request left the engine at an iteration boundary: done, or stopped by its client."""
        ttfb = req.t_first_ms + req.post_ms - req.t_gateway_ms
        if req.stop_after:
            t_done = now + req.post_ms
            self._complete(
                req,
                t_done,
                outcome="client_abort",
                http_status=0,
                ttfb_ms=ttfb,
                output_tokens=req.stop_after,
            )
            return
        cfg = self._cfg
        queue = _r(req.t_sched_ms - req.t_engine_ms)
        prefill = _r(req.t_first_ms - req.t_sched_ms)
        decode = _r(now - req.t_first_ms)
        inference = prefill + decode
        cold: int | None = None
        if (
            eng.restart_ms >= 0
            and req.t_sched_ms >= eng.restart_ms
            and req.t_engine_ms < eng.ready_ms + cfg.cold_start_window_ms
        ):
            cold = self._wall_ns(eng.restart_ms, eng.skew_ms)
        self._emit(
            EngineFinished(
                **self._stamp(eng, now),
                event_id=f"{req.request_id}:engine.finished",
                request_id=req.request_id,
                kind="engine.finished",
                arrival_unix_ns=self._wall_ns(req.t_engine_ms, eng.skew_ms),
                queue_ms=queue,
                prefill_ms=prefill,
                decode_ms=decode,
                inference_ms=inference,
                e2e_ms=queue + inference,
                prompt_tokens=req.prompt_tokens,
                output_tokens=req.gen_tokens,
                cached_tokens=req.cached_tokens,
                finish_reason="length" if req.gen_tokens >= cfg.max_output_tokens else "stop",
                preemptions=0,
                priority=req.priority,
                cold_start_unix_ns=cold,
            )
        )
        t_done = now + req.post_ms
        first_byte = ttfb if req.stream else t_done - req.t_gateway_ms
        self._complete(
            req,
            t_done,
            outcome="ok",
            http_status=200,
            ttfb_ms=first_byte,
            output_tokens=req.gen_tokens,
        )

    def _stamp(self, eng: _Engine, now: float) -> dict[str, Any]:
        """What each event of engine ``eng`` carries: contract version 1, its host and
        model, and ``now`` on the engine's own (skewed) clock."""
        return {
            "v": 1,
            "ts_unix_ns": self._wall_ns(now, eng.skew_ms),
            "host": eng.host,
            "model": eng.model.name,
        }

    # -- stats --------------------------------------------------------------

    def _on_stats(self) -> None:
        if self._open_requests <= 0:
            return
        cfg = self._cfg
        now = self._now_ms
        for eng in self._engines:
            done = eng.iterations_done(now)
            kv_tokens = eng.running_prompt_tokens + eng.running * done - eng.running_admit_iter_sum
            kv = min(1.0, max(0.0, kv_tokens / eng.model.kv_capacity_tokens))
            hit = eng.hit_cached / eng.hit_prompt if eng.hit_prompt > 0 else None
            self._emit(
                EngineStats(
                    **self._stamp(eng, now),
                    event_id=f"{eng.host}:engine.stats:{self._stats_seq:09d}",
                    kind="engine.stats",
                    num_running=eng.running,
                    num_waiting=eng.waiting_live,
                    kv_cache_usage=round(kv, 6),
                    prefix_cache_hit_rate=None if hit is None else round(min(1.0, hit), 6),
                    gpu_memory_used_fraction=round(
                        cfg.gpu_memory_static_fraction + cfg.gpu_memory_kv_fraction * kv, 6
                    ),
                )
            )
            eng.hit_cached *= 0.9  # ~10-interval memory
            eng.hit_prompt *= 0.9
        self._stats_seq += 1
        self._push(now + cfg.stats_interval_ms, _K_STATS, None)
