"""The gateways and clients of the simulator (gates, refusals, retries, patience,
queue cut-offs): see :mod:`producers.simulator.model`."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.contract.events import GatewayReceived
from producers.simulator.engines import EngineLoop
from producers.simulator.gate import Arrival, Verdict
from producers.simulator.state import (
    _DONE,
    _K_ARRIVE,
    _K_CUTOFF,
    _K_HOLD,
    _K_PATIENCE,
    _K_RETRY,
    _NS_PER_MS,
    _PENDING,
    _RUNNING,
    _WAITING,
    _Req,
    _unit_hash,
    sdk_retry_delay_ms,
)


class GatewayLoop(EngineLoop):
    """Gateways ask the gate, refuse, forward; clients retry, give up, are cut off."""

    def _arrival(self, req: _Req) -> Arrival:
        return Arrival(
            model=self._cfg.models[req.model_idx].name,
            priority=req.priority,
            request_id=req.request_id,
            session_id=req.session or req.request_id,
            gateway=req.gateway,
            prompt_tokens=req.prompt_tokens,
            t_ms=req.t_gateway_ms,
            attempt=req.attempt,  # the SDK's x-stainless-retry-count
            tenant=req.tenant,
            slo_ttft_ms=req.slo_ttft_ms,
            stream=req.stream,
        )

    def _on_gateway_arrival(self, req: _Req) -> None:
        cfg = self._cfg
        verdict = None
        if self._gate is not None:
            self._directives_arrive(req.t_gateway_ms)
            self._first_bytes_until(req.t_gateway_ms)
            decision = self._gate.decision(self._arrival(req))
            verdict = decision.act
            if decision.mode != "off":
                req.control = (decision.mode, decision.verdict.reason)
            if verdict.reason is None and not verdict.held:
                self._gate_admitted(req, verdict)
        self._emit(
            GatewayReceived(
                v=1,
                event_id=f"{req.request_id}:gateway.received",
                ts_unix_ns=self._wall_ns(req.t_gateway_ms),
                host=req.gateway,
                model=cfg.models[req.model_idx].name,
                request_id=req.request_id,
                kind="gateway.received",
                priority=req.priority,
                tenant=req.tenant,
                prompt_tokens=req.prompt_tokens,
                stream=req.stream,
                # the client's retry count; a retry names its first try (the logical
                # request's key, pipeline/core/logical.py)
                client_attempt=req.attempt,
                logical_request_id=req.session or None,
            )
        )
        if verdict is not None and verdict.reason is not None:
            self._reject_at_gateway(
                req, verdict.status, verdict.retry_after_s, verdict.should_retry
            )
            return
        if verdict is not None and verdict.held:  # waits at the gateway for a token
            req.hold_ticket = verdict.hold_ticket
            self._push(verdict.recheck_at_ms or req.t_gateway_ms, _K_HOLD, req)
        else:
            self._forward(req, verdict, req.t_gateway_ms)
        if req.patience_ms is not None:
            self._push(req.t_gateway_ms + req.patience_ms, _K_PATIENCE, req)

    def _gate_admitted(self, req: _Req, verdict: Verdict) -> None:
        req.gate_model = self._cfg.models[req.model_idx].name
        req.cutoff_ms = verdict.queue_timeout_ms
        req.cutoff_retry_after_s = verdict.retry_after_s
        fb = self._model_idx.get(verdict.fallback_model or "")
        if fb is not None:
            req.model_idx = fb

    def _on_hold(self, req: _Req) -> None:
        """A held request asks the gate again (:meth:`GatewayGate.resume`): forwarded,
        refused, or held on; gone if its client left meanwhile."""
        assert self._gate is not None
        assert req.hold_ticket is not None
        arrival = self._arrival(req)
        if req.state == _DONE:
            self._gate.cancel(arrival, req.hold_ticket)
            return
        now = self._now_ms
        self._directives_arrive(now)
        self._first_bytes_until(now)
        decision = self._gate.resume(arrival, req.hold_ticket, now)
        verdict = decision.act
        if verdict.held:
            self._push(verdict.recheck_at_ms or now, _K_HOLD, req)
            return
        req.hold_ticket = None
        if decision.mode != "off":
            req.control = (decision.mode, decision.verdict.reason)
        if verdict.reason is not None:
            self._reject_at_gateway(
                req, verdict.status, verdict.retry_after_s, verdict.should_retry, t_ms=now
            )
            return
        self._gate_admitted(req, verdict)
        self._forward(req, verdict, now)

    def _forward(self, req: _Req, verdict: Verdict | None, t_ms: float) -> None:
        """The admitted request goes on to an engine after the gateway's overhead."""
        cfg = self._cfg
        if verdict is not None and verdict.cap_context_tokens is not None:
            cap = verdict.cap_context_tokens
            req.prompt_tokens = min(req.prompt_tokens, cap)
            block = cfg.kv_block_tokens
            req.cached_tokens = min(req.cached_tokens, ((req.prompt_tokens - 1) // block) * block)
        if self._gate is not None and req.gate_model:  # as the gate admitted it
            req.forwarded = self._gate.forwarded(req.gateway, req.gate_model, req.slo_ttft_ms, t_ms)
        self._push(t_ms + req.pre_ms, _K_ARRIVE, req)

    def _reject_at_gateway(
        self,
        req: _Req,
        http_status: int,
        retry_after_s: int,
        should_retry: bool | None,
        *,
        t_ms: float | None = None,
    ) -> None:
        """The enforcement's refusal (429 + Retry-After [+ x-should-retry]) at ``t_ms``
        (its arrival unless held) after the gateway's own overhead; the client may retry
        (:meth:`_refuse`), as a new request."""
        at_ms = req.t_gateway_ms if t_ms is None else t_ms
        t_done = at_ms + req.pre_ms + req.post_ms
        req.state = _PENDING
        self._refuse(req, t_done, http_status, retry_after_s, should_retry)

    def _directives_arrive(self, t_ms: float) -> None:
        """The directives that reached the gateways by ``t_ms``
        (:meth:`GatewayGate.advance`, on the simulator's clock: the gate records each
        decision's delay from its evidence): a new decision's queue cut-off also applies
        to what the gateways already forwarded (:meth:`apply_queue_cutoff`). The one
        path for a backtest's in-process directives and the demo's control topic."""
        assert self._gate is not None
        for scope, d in self._gate.advance(self._wall_ns(t_ms) / _NS_PER_MS):
            actions = d.actions
            cutoff = getattr(actions, "queue_timeout_ms", None)
            if cutoff is None:
                continue
            models = [m.name for m in self._cfg.models] if scope == "*" else [scope]
            for m in models:
                self.apply_queue_cutoff(m, cutoff, actions.retry_after_s)

    def apply_queue_cutoff(
        self, model: str, cutoffs_ms: Sequence[float | None], retry_after_s: int
    ) -> int:
        """A directive's queue cut-off (per priority 0..3, priority 0's always None)
        reaches the gateways of ``model`` now: a request waiting in its engines' queues
        for its priority's cut-off or more is cancelled (503 + Retry-After; the client
        retries as after a 429), the others get the cut-off from when they reached the
        engine. Returns how many were cancelled."""
        idx = self._model_idx.get(model)
        if idx is None:
            return 0
        now = self._now_ms
        cancelled = 0
        for e in self._engines_of_model[idx]:
            eng = self._engines[e]
            for q in eng.queues:
                for req in list(q):
                    if req.state != _WAITING or req.cutoff_ms is not None:
                        continue
                    cutoff = cutoffs_ms[req.priority] if req.priority < len(cutoffs_ms) else None
                    if cutoff is None or req.priority == 0:
                        continue
                    req.cutoff_ms, req.cutoff_retry_after_s = cutoff, retry_after_s
                    due = req.t_engine_ms + cutoff
                    if due <= now:
                        self._on_cutoff(req)
                        cancelled += 1
                    else:
                        self._push(due, _K_CUTOFF, req)
        return cancelled

    def _on_cutoff(self, req: _Req) -> None:
        if req.state != _WAITING:
            return
        self._engines[req.engine].waiting_live -= 1
        self.cutoffs += 1
        self._refuse(req, self._now_ms + req.post_ms, 503, req.cutoff_retry_after_s)

    def _refuse(
        self,
        req: _Req,
        t_done: float,
        http_status: int,
        retry_after_s: int,
        should_retry: bool | None = None,
    ) -> None:
        """Answer ``http_status`` + Retry-After at ``t_done``; the client retries or not
        (:func:`sdk_retry_delay_ms`)."""
        cfg = self._cfg
        self._complete(
            req,
            t_done,
            outcome="rejected",
            http_status=http_status,
            ttfb_ms=t_done - req.t_gateway_ms,
            output_tokens=0,
        )
        session = req.session or req.request_id
        # The SDK's random() for its backoff jitter, drawn from the request id (no draw
        # from the run's RNG: the other events of a run do not move when retries change).
        wait = sdk_retry_delay_ms(
            cfg,
            retries_taken=req.attempt,
            http_status=http_status,
            retry_after_s=retry_after_s,
            should_retry=should_retry,
            u=_unit_hash(req.request_id),
        )
        if wait is None:
            return
        retry = _Req(
            request_id=f"{session}-r{req.attempt + 1}",
            t_gateway_ms=t_done + wait,
            model_idx=req.model_idx,
            gateway=req.gateway,
            prompt_tokens=req.prompt_tokens,
            cached_tokens=req.cached_tokens,
            gen_tokens=req.gen_tokens,
            stop_after=req.stop_after,
            priority=req.priority,
            tenant=req.tenant,
            stream=req.stream,
            pre_ms=req.pre_ms,
            post_ms=req.post_ms,
            patience_ms=req.patience_ms,
            attempt=req.attempt + 1,
            session=session,
            slo_ttft_ms=req.slo_ttft_ms,
        )
        self._open_requests += 1
        self.retries += 1
        self._push(retry.t_gateway_ms, _K_RETRY, retry)

    def _on_patience(self, req: _Req) -> None:
        if req.state == _DONE:
            return
        now = self._now_ms
        if req.stream and req.t_first_ms >= 0 and req.t_first_ms + req.post_ms <= now:
            return  # the first byte reached the client in time
        if req.state == _WAITING:
            self._engines[req.engine].waiting_live -= 1
        elif req.state == _RUNNING:
            self._drop_running(self._engines[req.engine], req, now)
        self._complete(
            req, now, outcome="client_abort", http_status=0, ttfb_ms=None, output_tokens=0
        )

    def _on_queue_timeout(self, req: _Req) -> None:
        if req.state != _WAITING:
            return
        self._engines[req.engine].waiting_live -= 1
        t_done = self._now_ms + req.post_ms
        self._complete(
            req,
            t_done,
            outcome="rejected",
            http_status=503,
            ttfb_ms=t_done - req.t_gateway_ms,
            output_tokens=0,
        )
