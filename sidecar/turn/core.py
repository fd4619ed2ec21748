"""The core: one turn of a session, from recognising the session to recording the finished reply.

The order matters: a turn is recorded in the session store only after the engine finished it, so a
failed, aborted or rejected request never changes what the next turn continues from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from sidecar import logs
from sidecar.conversation.chat_template import ChatRenderer
from sidecar.conversation.fingerprint import extend_fingerprint, reply_message
from sidecar.conversation.store import Resolution, Session, SessionStore, TurnState, check_session_id
from sidecar.engine.generate import generate_request, sampling_params
from sidecar.engine.lease import LeaseRequest
from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.worker import Worker, Workers
from sidecar.errors import APIError, invalid_request
from sidecar.generation.relay import Generation, GenerationResult
from sidecar.generation.tool_parsers import Event, get_tool_parser
from sidecar.id_text import IdText
from sidecar.metrics import SidecarMetrics
from sidecar.policy import AdmissionRejected, SessionPolicy, TurnEnd, build_policy
from sidecar.settings import ServerSettings, SidecarSettings
from sidecar.turn.request import TurnRequest

log = logging.getLogger("sidecar")


class TurnCore:
    """What every front door shares: sessions, the chat template, the policy, the workers."""

    def __init__(
        self,
        settings: ServerSettings,
        renderer: ChatRenderer,
        sessions: SessionStore,
        policy: SessionPolicy,
        workers: Workers,
        metrics: SidecarMetrics,
        model_name: str,
    ):
        self.settings = settings
        self.renderer = renderer
        self.sessions = sessions
        self.policy = policy
        self.workers = workers
        self.metrics = metrics
        self.model_name = model_name  # what the doors call the model
        self._model_fixed = settings.model_name is not None  # --model-name wins over SGLang's
        self._refreshing: asyncio.Task | None = None
        self._info_errors: dict[Worker, APIError] = {}  # why a worker's last /server_info failed
        for worker in workers:
            self._show_capacity(worker.capacity)

    def serves_model(self, model: str | None) -> bool:
        """Whether a request's ``model`` names the served model (no name: the served one)."""
        return model is None or model == self.model_name or self.settings.accept_any_model

    def turn(self, request: TurnRequest) -> Turn:
        return Turn(self, request)

    def check(self, request: TurnRequest) -> None:
        """What any request must pass before its history is rendered (400 otherwise)."""
        if len(request.messages) > self.settings.max_messages:
            raise invalid_request(f"too many messages ({len(request.messages)} > {self.settings.max_messages})", param="messages")
        self.renderer.check_template_kwargs(request.template_kwargs)

    def count_tokens(self, request: TurnRequest) -> int:
        """The request's prompt in tokens, rendered whole (what a new session would send)."""
        self.check(request)
        return len(self.renderer.render_full(request.messages, request.tools, request.template_kwargs))

    # ---------------------------------------------------------------- engine info
    async def refresh_engine_info(self) -> None:
        """Ask every worker (again) what it holds, its model and limits. Until a worker has told
        its capacity it admits no new session (503), so protections never lapse because SGLang
        started after the sidecar; a restarted SGLang (new startup time) is read afresh. One
        refresh at a time: concurrent callers wait for the same one."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        for worker in self.workers:
            try:
                self.engine_info(worker, await worker.read_info())
                self._info_errors.pop(worker, None)
            except APIError as exc:
                self._info_errors[worker] = exc

    async def require_engine_info(self, worker: Worker) -> None:
        """Return once ``worker`` has told its capacity (asking it now if it has not); else the
        503 that keeps new sessions out, or the error SGLang answered with (e.g. its API key)."""
        if worker.capacity.known:
            return
        await self.refresh_engine_info()
        if worker.capacity.known:
            return
        error = self._info_errors.get(worker)
        if error is not None and error.status != 503:
            raise error
        raise APIError(
            503,
            "SGLang has not told its KV capacity yet (is it up?); no session is admitted without it",
            type="engine_unavailable",
            code="engine_info_unknown",
            headers={"Retry-After": "2"},
        )

    def engine_info(self, worker: Worker, info: dict) -> None:
        """What ``worker``'s /server_info says, taken into account."""
        capacity = EngineCapacity.from_server_info(info)
        if not self._model_fixed:
            self.model_name = engine_model_name(info, self.model_name)
        if capacity == worker.capacity:
            return
        worker.capacity = capacity
        self.policy.set_capacity(capacity)  # one worker today: the policy admits against it
        self._show_capacity(capacity)
        log.info(
            "engine at %s: GPU KV %d tokens, host tier %d tokens, prompt limit %d, session_ttl plugin %s",
            worker.client.base_url, capacity.max_total_num_tokens, capacity.host_tokens,
            capacity.max_req_input_len, "on" if capacity.plugin else "off",
        )

    def _show_capacity(self, capacity: EngineCapacity) -> None:
        self.metrics.engine_capacity.labels(tier="gpu").set(capacity.max_total_num_tokens)
        self.metrics.engine_capacity.labels(tier="host").set(capacity.host_tokens)
        self.metrics.engine_info_known.set(1 if capacity.known else 0)


def engine_model_name(info: dict, default: str = "default") -> str:
    """The model id SGLang serves, as its /server_info names it."""
    return info.get("served_model_name") or info.get("model_path") or default


def build_core(settings: SidecarSettings, tokenizer, workers: Workers, metrics: SidecarMetrics, model_name: str) -> TurnCore:
    """The core and its services: the chat template (ValueError if the tokenizer has none), the
    policy (admitting against the worker's capacity: one worker today), the session store."""
    renderer = ChatRenderer(tokenizer)
    (worker,) = workers
    policy = build_policy(settings, worker.capacity, registry=metrics.registry)
    sessions = SessionStore(policy, settings.server.max_sessions, metrics)
    return TurnCore(settings.server, renderer, sessions, policy, workers, metrics, model_name)


class Turn:
    """``async with core.turn(request) as turn:`` then iterate ``turn.events()``.

    Entering recognises the session, builds the exact prompt ids, waits for admission and asks for
    the lease; an APIError raised there is a plain HTTP error (nothing reached the engine).
    Leaving records the turn if it finished, has the relay abort an engine request nobody reads,
    and releases the admission and the session, however the turn ended. The turn keeps no
    reference to the request once entered (the door frees the parsed history when it likes).
    """

    def __init__(self, core: TurnCore, request: TurnRequest):
        self.core = core
        self.started_at = time.monotonic()  # time to first token counts from here
        self._request: TurnRequest | None = request
        self.resolution: Resolution | None = None
        self.generation: Generation | None = None
        self._n_messages = 0
        self._admitted = False
        self._lease: LeaseRequest | None = None  # the lease the request asked for

    @property
    def session(self) -> Session:
        return self.resolution.session

    @property
    def result(self) -> GenerationResult:
        return self.generation.result

    def events(self) -> AsyncIterator[Event]:
        """The reply's content and tool-call events as the engine streams them."""
        return self.generation.events()

    async def __aenter__(self) -> Turn:
        req, self._request = self._request, None
        core = self.core
        core.check(req)
        explicit = check_session_id(req.session_id) if req.session_id is not None else None
        res = self.resolution = core.sessions.resolve(req.messages, explicit, req.scope)
        logs.bind_session(res.session.public_id)
        self._n_messages = len(req.messages)
        session = res.session
        session.inflight += 1
        try:
            await self._prepare(req, res, session)
        except BaseException:
            self._release()
            raise
        return self

    async def _prepare(self, req: TurnRequest, res: Resolution, session: Session) -> None:
        core, renderer = self.core, self.core.renderer
        ids = self._prompt_ids(req, res)
        parser_name = "none" if (req.tool_choice == "none" or not req.tools) else core.settings.tool_parser
        parser = get_tool_parser(parser_name)
        forced = parser.forced_prefix(req.forced_tool) if req.tool_choice == "required" else None
        if forced is not None:
            ids += renderer.encode(forced)
        worker = session.worker or core.workers.place(session.id)
        await core.require_engine_info(worker)
        limit = core.settings.max_prompt_tokens or worker.capacity.max_req_input_len
        if limit and len(ids) > limit:
            raise invalid_request(
                f"prompt is {len(ids)} tokens, more than the limit of {limit}", param="messages", code="context_length_exceeded"
            )
        core.metrics.turns.labels(kind="continued" if res.base else ("new" if res.is_new_session else "branch")).inc()
        try:
            await core.policy.admit(session.id, len(ids), res.is_new_session)
        except AdmissionRejected as exc:
            raise APIError(
                429,
                str(exc),
                type="rate_limit_error",
                code="admission_queue_full",
                headers={"Retry-After": str(max(1, round(exc.retry_after_s)))},
            ) from None
        self._admitted = True
        session.worker = worker  # its requests go there from now on
        now = time.monotonic()
        core.policy.on_request(session.id, len(ids), now)
        lease = self._lease = core.policy.lease_request(session.id, len(ids), now)
        params = sampling_params(req.sampling, core.settings.default_max_tokens, renderer.eos_ids, lease)
        self.generation = Generation(
            worker.client, generate_request(ids, session.id, params), renderer.codec, parser, req.stop, forced,
            on_tokens=core.metrics.observe_tokens,
        )

    def _prompt_ids(self, req: TurnRequest, res: Resolution) -> IdText:
        """The engine's ids of the previous turn + only the new messages, or the whole history."""
        renderer = self.core.renderer
        if res.base is not None:
            new = req.messages[res.new_messages_from :]
            return res.base.token_ids + renderer.render_suffix(new, res.base.end_id, req.tools, req.template_kwargs)
        return IdText(renderer.render_full(req.messages, req.tools, req.template_kwargs))

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            self.generation.close()
            first_token_at = self.generation.result.first_token_at
            if first_token_at is not None:  # also for a turn that failed after its first token
                self.core.metrics.ttft.observe(first_token_at - self.started_at)
            if exc_type is None and self.generation.finished:
                self._record()
        finally:
            self._release()

    def _record(self) -> None:
        """The finished turn becomes what the next request continues from; the gap starts."""
        core, res, gen = self.core, self.resolution, self.generation
        result = gen.result
        reply = reply_message(result.content, [(c.name, c.arguments) for c in result.tool_calls])
        ids = gen.payload["input_ids"] + result.output_ids
        parent = res.base.fingerprint if res.base is not None else None
        state = TurnState(extend_fingerprint(res.fingerprint, reply), self._n_messages + 1, ids, result.end_id, parent)
        core.sessions.record_turn(res.session, state)
        tool_names = [c.name for c in result.tool_calls]
        now = time.monotonic()
        core.policy.on_turn_end(TurnEnd(res.session.id, len(ids), tool_names, now))
        revised = core.policy.after_turn(res.session.id, now)
        worker = res.session.worker
        if revised is not None and worker.capacity.plugin and worth_revising(self._lease, revised):
            worker.revise_lease(res.session.id, revised)
            core.policy.lease_revised(res.session.id, revised, now)
        metrics = core.metrics
        metrics.prompt_tokens.inc(result.prompt_tokens)
        metrics.cached_tokens.inc(result.cached_tokens)
        metrics.completion_tokens.inc(result.completion_tokens)

    def _release(self) -> None:
        session = self.resolution.session
        session.inflight -= 1
        if self._admitted:
            self.core.policy.release_admission(session.id)
        if not session.turns and not session.inflight and not session.explicit:
            self.core.sessions.forget(session, "failed")  # a first request that failed leaves nothing behind


REVISE_IF_CHANGED_BY = 0.2  # relative change of the TTL or the expected return worth a message


def worth_revising(sent: LeaseRequest | None, revised: LeaseRequest) -> bool:
    """Send the after-turn lease only when the reply's tools moved the prediction (most turns'
    expectation is what the request already carried; each update is one more call to SGLang)."""
    if sent is None:
        return True

    def moved(a: float | None, b: float | None) -> bool:
        if a is None or b is None:
            return (a is None) != (b is None)
        return abs(a - b) > REVISE_IF_CHANGED_BY * max(abs(a), 1e-3)

    return moved(sent.ttl_s, revised.ttl_s) or moved(sent.expected_back_s, revised.expected_back_s)
