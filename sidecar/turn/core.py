"""The core: one turn of a session, from recognising the session to recording the finished reply.

The order matters: a turn is recorded in the session store only after the engine finished it, so a
failed, aborted or rejected request never changes what the next turn continues from.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import AsyncIterator

from sidecar import logs
from sidecar.conversation.chat_template import ChatRenderer
from sidecar.conversation.fingerprint import chain_fingerprint, fingerprints, reply_message
from sidecar.conversation.store import Resolution, Session, SessionStore, check_session_id
from sidecar.conversation.tokens import TooManyTokens
from sidecar.engine.generate import generate_request, sampling_params
from sidecar.engine.fleet import Fleet
from sidecar.engine.lease import LeaseRequest
from sidecar.engine.worker import WorkerRoute, Workers
from sidecar.errors import invalid_request, model_not_found
from sidecar.generation.relay import Generation, GenerationResult
from sidecar.generation.tool_parsers import Event, get_tool_parser
from sidecar.metrics import SidecarMetrics
from sidecar.policy import AdmissionRejected, SessionPolicy, build_policy
from sidecar.settings import ServerSettings, SidecarSettings
from sidecar.turn.cache_namespace import CacheNamespace, visible_cached
from sidecar.turn.offload import Offload, request_weight
from sidecar.turn.policy_calls import turn_finished, turn_started
from sidecar.turn.prompt import (
    COUNT_TOKENS_LIMIT,
    SURELY_TOO_LONG_CHARS_PER_TOKEN,
    count_rendered_strings,
    prompt_ids,
    too_long,
)
from sidecar.turn.request import TurnRequest, check_counts
from sidecar.turn.tenants import RateLimits, too_many

log = logging.getLogger("sidecar")


class TurnCore:
    """What every front door shares: sessions, the chat template, the policy, the fleet of workers."""

    def __init__(
        self,
        settings: ServerSettings,
        renderer: ChatRenderer,
        sessions: SessionStore,
        policy: SessionPolicy,
        fleet: Fleet,
        metrics: SidecarMetrics,
    ):
        self.settings = settings
        self.renderer = renderer
        self.sessions = sessions
        self.policy = policy
        self.fleet = fleet  # which worker a session's request goes to; engine info
        self.workers = fleet.workers
        self.metrics = metrics
        self.offload = Offload(settings.tokenize_timeout, settings.tokenize_threads)  # large prompts are prepared there
        self.namespace = CacheNamespace(settings.cache_isolation, settings.shared_prefix_file)
        self.rate_limits = RateLimits(settings.key_rate_limit, settings.key_rate_burst)

    @property
    def model_name(self) -> str:
        """What the doors call the model (--model-name, else what SGLang says it serves)."""
        return self.fleet.model_name

    def serves_model(self, model: str | None) -> bool:
        """Whether a request's ``model`` names the served model (no name: the served one)."""
        return model is None or model == self.model_name or self.settings.accept_any_model

    async def check_model(self, model: str | None) -> None:
        """The one model-name rule of every door: ``model`` is the served id (as /v1/models lists
        it), or absent, or anything with --accept-any-model; else 404 ``model_not_found``. While no
        engine has named its model yet, the engine is asked again, then 503 (retry): a correctly
        configured client is not told its model does not exist because SGLang started late."""
        await self.fleet.require_model_name()
        if not self.serves_model(model):
            raise model_not_found(model or "")

    def turn(self, request: TurnRequest) -> Turn:
        return Turn(self, request)

    def check(self, request: TurnRequest) -> None:
        """What any request must pass before its history is rendered (400 otherwise)."""
        check_counts(len(request.messages), len(request.tools or ()), self.settings)
        vocab = self.renderer.vocab_size
        if any(not 0 <= t < vocab for t in request.sampling.stop_token_ids or ()):
            raise invalid_request(f"stop_token_ids must be token ids in [0, {vocab})", param="stop_token_ids")
        self.renderer.check_template_kwargs(request.template_kwargs)

    async def refuse_surely_too_long(self, request: TurnRequest) -> None:
        """A request whose text is many times what the prompt limit can hold is counted first, its
        long strings as plain text (on the pool, bounded by the limit): past the limit it is refused
        before it is hashed or rendered, work (one JSON encoding of a 12 MB tool argument) that
        holds the GIL and so the event loop for tens of milliseconds at a time."""
        limit = self.settings.max_prompt_tokens or max((w.capacity.max_req_input_len for w in self.workers), default=0)
        enough = SURELY_TOO_LONG_CHARS_PER_TOKEN * limit
        if not limit or request_weight(request.messages, request.tools, request.template_kwargs, enough + 1) <= enough:
            return
        try:
            await self.offload.run(count_rendered_strings, self.renderer.codec, request, limit, key=request.scope, weight=enough)
        except TooManyTokens as exc:
            raise too_long(f"at least {exc.at_least}", limit) from None

    async def count_tokens(self, request: TurnRequest) -> int:
        """The request's prompt in tokens, rendered whole (what a new session would send): the
        key's request rate and the checks of a turn hold, and a large prompt is rendered and
        tokenized on the worker thread (503 tokenizer_busy past its deadline), as a turn's is."""
        self.rate_limits.take(request.scope)
        self.check(request)
        await self.refuse_surely_too_long(request)
        render = self.renderer.render_full
        limit = self.settings.max_prompt_tokens or self.workers.first().capacity.max_req_input_len or COUNT_TOKENS_LIMIT
        args = (request.messages, request.tools, request.template_kwargs, limit)
        weight = _text_chars(request)
        try:
            return len(await self.offload.prepare(render, *args, key=request.scope, weight=weight))
        except TooManyTokens as exc:  # counted ahead: no text is tokenized past the limit
            raise too_long(f"at least {exc.at_least}", limit) from None

def build_core(settings: SidecarSettings, tokenizer, workers: Workers, metrics: SidecarMetrics, model_name: str) -> TurnCore:
    """The core and its services: the chat template (ValueError if the tokenizer has none), the
    policy (admitting against each worker's capacity), the fleet on it, the session store."""
    renderer = ChatRenderer(tokenizer)
    first, *others = workers
    policy = build_policy(settings, first.capacity, registry=metrics.registry, worker=first.url)
    for worker in others:
        policy.set_capacity(worker.capacity, worker.url)
    fleet = Fleet(workers, policy, metrics, model_name, model_fixed=settings.server.model_name is not None)
    sessions = SessionStore(policy, settings.server.max_sessions, metrics, settings.server.max_session_bytes)
    return TurnCore(settings.server, renderer, sessions, policy, fleet, metrics)


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
        self._cached_view: tuple[int, int] | None = None  # shared cache namespace: (own, shared block)
        self._route: WorkerRoute | None = None
        self._rehomed_history = 0  # tokens of history a re-homed turn sends to its new worker

    @property
    def session(self) -> Session:
        return self.resolution.session

    @property
    def result(self) -> GenerationResult:
        """The generation's result as the agent may see it (in the shared cache namespace, its
        cached tokens only as far as its own history or the whole shared block explain them)."""
        result = self.generation.result
        if self._cached_view is None:
            return result
        return dataclasses.replace(result, cached_tokens=visible_cached(result.cached_tokens, *self._cached_view))

    def events(self) -> AsyncIterator[Event]:
        """The reply's content and tool-call events as the engine streams them."""
        return self.generation.events()

    def batches(self) -> AsyncIterator[list[Event]]:
        """The same events, as lists of what one read of the engine's stream brought (a stream
        writes each list at once)."""
        return self.generation.batches()

    async def __aenter__(self) -> Turn:
        req, self._request = self._request, None
        core = self.core
        core.rate_limits.take(req.scope)
        core.check(req)
        explicit = check_session_id(req.session_id) if req.session_id is not None else None
        await core.refuse_surely_too_long(req)
        res = self.resolution = await self._resolve(req, explicit)
        # megabytes of text are hashed, rendered and tokenized off the event loop (sidecar.turn.offload);
        # a continuing turn renders and tokenizes only its new messages, so only they count
        weight = _text_chars(req, req.messages[res.new_messages_from :])
        logs.bind_session(res.session.public_id)
        self._n_messages = len(req.messages)
        session = res.session
        session.inflight += 1
        try:
            await self._prepare(req, res, session, weight)
        except BaseException:
            self._release()
            raise
        return self

    async def _resolve(self, req: TurnRequest, explicit: str | None) -> Resolution:
        """The session and turn the request continues. A stored turn it continues (of the session
        its id names, or found by its last messages) is matched by comparing the messages with it,
        and only the new messages are hashed; else the whole history is fingerprinted (off the
        event loop when it is large)."""
        core, messages = self.core, req.messages
        base = core.sessions.known_turn(messages, explicit, req.scope)
        if base is not None:
            new = messages[base.n_messages :]
            weight = _text_chars(req, new)
            fp = await core.offload.prepare(chain_fingerprint, base.fingerprint, new, key=req.scope, weight=weight)
            res = core.sessions.continue_turn(messages, explicit, req.scope, base, fp, keys=False)
            if res is not None:
                return res
        weight = _text_chars(req)
        prints = await core.offload.prepare(fingerprints, messages, key=req.scope, weight=weight)
        return core.sessions.resolve(messages, explicit, req.scope, prints, keys=False)  # keys: with the prompt ids

    async def _prepare(self, req: TurnRequest, res: Resolution, session: Session, weight: int) -> None:
        core, renderer = self.core, self.core.renderer
        parser_name = "none" if (req.tool_choice == "none" or not req.tools) else core.settings.tool_parser
        parser = get_tool_parser(parser_name)
        forced = parser.forced_prefix(req.forced_tool) if req.tool_choice == "required" else None
        if core.fleet.rehome_if_lost(session):  # what its new worker recomputes is counted once prefilled
            self._rehomed_history = len(res.base.token_ids) if res.base is not None else 0
        worker = core.fleet.home(session)
        limit_worker = worker or core.workers.first()  # placement may still choose: any worker's limit
        await core.fleet.require_engine_info(limit_worker)
        limit = core.settings.max_prompt_tokens or limit_worker.capacity.max_req_input_len
        try:
            ids = await core.offload.prepare(prompt_ids, renderer, req, res, forced, limit, key=req.scope, weight=weight)
        except TooManyTokens as exc:
            raise too_long(f"at least {exc.at_least}", limit) from None
        if limit and len(ids) > limit:
            raise too_long(str(len(ids)), limit)
        core.metrics.turns.labels(kind="continued" if res.base else ("new" if res.is_new_session else "branch")).inc()
        try:
            await core.policy.admit(session.id, len(ids), res.is_new_session, req.scope, ids)
        except AdmissionRejected as exc:
            raise too_many(str(exc), exc.retry_after_s, exc.code) from None
        self._admitted = True
        if worker is None:  # placed by admission: the worker with room for it
            worker = await core.fleet.placed(session.id)
        session.worker = worker  # its requests go there from now on
        lease = self._lease = turn_started(core.policy, session.id, len(ids), time.monotonic())
        params = sampling_params(req.sampling, core.settings.default_max_tokens, renderer.eos_ids, lease)
        own = len(res.base.token_ids) if res.base is not None else 0
        salt, self._cached_view = core.namespace.salt(
            req.scope, req.messages, own, lambda: renderer.system_block_ids(req.messages, req.tools, req.template_kwargs)
        )
        self._route = worker.generation_route()
        self.generation = Generation(
            self._route, generate_request(ids, session.id, params, salt), renderer.codec, parser, req.stop, forced,
            on_tokens=core.metrics.observe_tokens,
        )

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            self.generation.close()
            first_token_at = self.generation.result.first_token_at
            if first_token_at is not None:  # also for a turn that failed after its first token
                self.core.metrics.ttft.observe(first_token_at - self.started_at)
            if self._rehomed_history:
                self.core.fleet.count_rehome(self._rehomed_history, self.generation.result.cached_tokens,
                                             first_token_at is not None)
            if exc_type is None and self.generation.finished:
                self._record()
        finally:
            self._release()

    def _record(self) -> None:
        """The finished turn becomes what the next request continues from; the gap starts."""
        core, res, gen = self.core, self.resolution, self.generation
        result = self.result
        reply = reply_message(result.content, [(c.name, c.arguments) for c in result.tool_calls])
        ids = gen.payload["input_ids"] + result.output_ids
        state = res.next_state(reply, ids, result.end_id)
        core.sessions.record_turn(res.session, state)
        session = res.session
        if self._route.served_by is not None:
            core.fleet.served_elsewhere(session, self._route.served_by, len(res.base.token_ids) if res.base is not None else 0)
        worker = session.worker
        revise = (lambda lease: worker.revise_lease(session.id, lease)) if worker.capacity.plugin else None
        tool_names = [c.name for c in result.tool_calls]
        turn_finished(core.policy, session.id, len(ids), tool_names, self._lease, time.monotonic(), revise)
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


def _text_chars(req: TurnRequest, messages: list[dict] | None = None) -> int:
    """What preparing a request costs, all fields counted (``sidecar.turn.offload.request_weight``);
    ``messages`` narrows it to the messages a continuing turn renders (its new ones)."""
    return request_weight(req.messages if messages is None else messages, req.tools, req.template_kwargs)
