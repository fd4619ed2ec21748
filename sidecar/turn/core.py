"""The core: one turn of a session, from recognising the session to recording the finished reply.

The order matters: a turn is recorded in the session store only after the engine finished it, so a
failed, aborted or rejected request never changes what the next turn continues from.
"""

from __future__ import annotations

import asyncio
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
from sidecar.engine.lease import LeaseRequest
from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.worker import Worker, WorkerRoute, Workers
from sidecar.errors import APIError, invalid_request, model_not_found
from sidecar.generation.relay import Generation, GenerationResult
from sidecar.generation.tool_parsers import Event, get_tool_parser
from sidecar.id_text import IdText
from sidecar.metrics import SidecarMetrics
from sidecar.policy import AdmissionRejected, SessionPolicy, TurnEnd, build_policy
from sidecar.settings import ServerSettings, SidecarSettings
from sidecar.turn.offload import OFFLOAD_CHARS, Offload, request_weight
from sidecar.turn.request import TurnRequest
from sidecar.turn.tenants import RateLimits, too_many

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
        self.offload = Offload(settings.tokenize_timeout, settings.tokenize_threads)  # large prompts are prepared there
        self.shared_prefix = _read_shared_prefix(settings.shared_prefix_file)
        self.rate_limits = RateLimits(settings.key_rate_limit, settings.key_rate_burst)
        self._model_fixed = settings.model_name is not None  # --model-name wins over SGLang's
        self.model_known = self._model_fixed or model_name != UNKNOWN_MODEL  # named by --model-name or SGLang
        self._refreshing: asyncio.Task | None = None
        self._info_errors: dict[Worker, APIError] = {}  # why a worker's last /server_info failed
        for worker in workers:
            self.watch(worker)
            self._show_capacity(worker.capacity)

    def watch(self, worker: Worker) -> None:
        """Placement hears when ``worker`` goes down (with several workers: one alone stays placeable)."""
        worker.on_down = lambda w: len(self.workers) > 1 and self.policy.set_placeable(w.url, False)

    def sync_placeable(self) -> None:
        """Placement's view of which workers take new sessions, after health and listing changed."""
        if len(self.workers) > 1:
            for worker in self.workers:
                self.policy.set_placeable(worker.url, worker.usable and worker.capacity.known)

    def serves_model(self, model: str | None) -> bool:
        """Whether a request's ``model`` names the served model (no name: the served one)."""
        return model is None or model == self.model_name or self.settings.accept_any_model

    async def check_model(self, model: str | None) -> None:
        """The one model-name rule of every door: ``model`` is the served id (as /v1/models lists
        it), or absent, or anything with --accept-any-model; else 404 ``model_not_found``. While no
        engine has named its model yet, the engine is asked again, then 503 (retry): a correctly
        configured client is not told its model does not exist because SGLang started late."""
        await self.require_model_name()
        if not self.serves_model(model):
            raise model_not_found(model or "")

    async def require_model_name(self) -> str:
        """The served model id; asks the workers again while none has named it, else 503."""
        if not self.model_known:
            await self.refresh_engine_info()
        if not self.model_known:
            refused = [e for e in self._info_errors.values() if e.status != 503]
            if refused:  # SGLang answered, with an error of its own (e.g. its API key): that error
                raise refused[0]
            raise APIError(
                503,
                "SGLang has not told which model it serves yet (is it up?)",
                type="engine_unavailable",
                code="engine_info_unknown",
                headers={"Retry-After": "2"},
            )
        return self.model_name

    def turn(self, request: TurnRequest) -> Turn:
        return Turn(self, request)

    def check(self, request: TurnRequest) -> None:
        """What any request must pass before its history is rendered (400 otherwise)."""
        settings = self.settings
        if len(request.messages) > settings.max_messages:
            raise invalid_request(f"too many messages ({len(request.messages)} > {settings.max_messages})", param="messages")
        if request.tools and len(request.tools) > settings.max_tools:
            raise invalid_request(f"too many tools ({len(request.tools)} > {settings.max_tools})", param="tools")
        vocab = self.renderer.vocab_size
        if any(not 0 <= t < vocab for t in request.sampling.stop_token_ids or ()):
            raise invalid_request(f"stop_token_ids must be token ids in [0, {vocab})", param="stop_token_ids")
        self.renderer.check_template_kwargs(request.template_kwargs)

    async def count_tokens(self, request: TurnRequest) -> int:
        """The request's prompt in tokens, rendered whole (what a new session would send): the
        key's request rate and the checks of a turn hold, and a large prompt is rendered and
        tokenized on the worker thread (503 tokenizer_busy past its deadline), as a turn's is."""
        self.rate_limits.take(request.scope)
        self.check(request)
        render = self.renderer.render_full
        limit = self.settings.max_prompt_tokens or self.workers.first().capacity.max_req_input_len or COUNT_TOKENS_LIMIT
        args = (request.messages, request.tools, request.template_kwargs, limit)
        weight = _text_chars(request)
        try:
            if weight >= OFFLOAD_CHARS:
                return len(await self.offload.run(render, *args, key=request.scope, weight=weight))
            return len(render(*args))
        except TooManyTokens as exc:  # counted ahead: no text is tokenized past the limit
            raise _too_long(f"at least {exc.at_least}", limit) from None

    # ---------------------------------------------------------------- engine info
    async def refresh_engine_info(self) -> None:
        """Ask every worker (again) what it holds, its model and limits. Until a worker has told
        its capacity it admits no new session (503), so protections never lapse because SGLang
        started after the sidecar; a restarted SGLang (new startup time) is read afresh. One
        refresh at a time: concurrent callers wait for the same one."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def refresh_workers(self) -> None:
        """With smg in front: its worker listing (joined, removed, unhealthy workers), then the
        engine info of any worker that has not told its capacity yet."""
        gateway = self.workers.gateway
        if gateway is None:
            return
        try:
            listing = await gateway.read_listing()
        except APIError as exc:
            log.warning("smg's /workers failed: %s", exc.message)
            return
        for worker in self.workers.apply_listing(listing):
            self.watch(worker)
        healthy = {w.url for w in listing if w.healthy}
        for worker in self.workers:  # smg has it healthy again: back once its own /health answers
            if not worker.up and not worker.removed and worker.url in healthy and await worker.client.healthy():
                log.info("worker %s is up again", worker.url)
                worker.up = True
        self.sync_placeable()
        if any(not w.capacity.known for w in self.workers if not w.removed):
            await self.refresh_engine_info()

    async def _refresh(self) -> None:
        for worker in self.workers:
            if worker.removed:
                continue
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
        if not self._model_fixed and engine_model_name(info, "") != "":
            self.model_name = engine_model_name(info)
            self.model_known = True
        if capacity == worker.capacity:
            return
        worker.capacity = capacity
        self.policy.set_capacity(capacity, worker.url)
        self.sync_placeable()
        self._show_capacity(capacity)
        log.info(
            "engine at %s: GPU KV %d tokens, host tier %d tokens, L3 storage %s, prompt limit %d, session_ttl plugin %s",
            worker.client.base_url, capacity.max_total_num_tokens, capacity.host_tokens,
            capacity.storage_backend or "none", capacity.max_req_input_len, "on" if capacity.plugin else "off",
        )
        if capacity.storage_backend == "file" and capacity.storage_waits and len(self.workers) > 1:
            log.warning("engine at %s: a re-homed session waits for its history from the file L3 store "
                        "(--hicache-storage-prefetch-policy %s); on an H200 that read was 3-25x slower than "
                        "recomputing it (benchmarks/results/h200-2026-12-01c-l3): best_effort recomputes at once",
                        worker.client.base_url, capacity.storage_prefetch_policy)

    def _show_capacity(self, capacity: EngineCapacity) -> None:
        self.metrics.engine_capacity.labels(tier="gpu").set(capacity.max_total_num_tokens)
        self.metrics.engine_capacity.labels(tier="host").set(capacity.host_tokens)
        self.metrics.engine_info_known.set(1 if capacity.known else 0)


UNKNOWN_MODEL = "default"  # what the doors call the model until an engine names it


def engine_model_name(info: dict, default: str = UNKNOWN_MODEL) -> str:
    """The model id SGLang serves, as its /server_info names it."""
    return info.get("served_model_name") or info.get("model_path") or default


def build_core(settings: SidecarSettings, tokenizer, workers: Workers, metrics: SidecarMetrics, model_name: str) -> TurnCore:
    """The core and its services: the chat template (ValueError if the tokenizer has none), the
    policy (admitting against the worker's capacity: one worker today), the session store."""
    renderer = ChatRenderer(tokenizer)
    first, *others = workers
    policy = build_policy(settings, first.capacity, registry=metrics.registry, worker=first.url)
    for worker in others:
        policy.set_capacity(worker.capacity, worker.url)
    sessions = SessionStore(policy, settings.server.max_sessions, metrics, settings.server.max_session_bytes)
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
        return dataclasses.replace(result, cached_tokens=_visible_cached(result.cached_tokens, *self._cached_view))

    def events(self) -> AsyncIterator[Event]:
        """The reply's content and tool-call events as the engine streams them."""
        return self.generation.events()

    async def __aenter__(self) -> Turn:
        req, self._request = self._request, None
        core = self.core
        core.rate_limits.take(req.scope)
        core.check(req)
        explicit = check_session_id(req.session_id) if req.session_id is not None else None
        res = self.resolution = await self._resolve(req, explicit)
        # megabytes of text are hashed, rendered and tokenized off the event loop (sidecar.turn.offload);
        # a continuing turn renders and tokenizes only its new messages, so only they count
        weight = _text_chars(req, req.messages[res.new_messages_from :])
        large = weight >= OFFLOAD_CHARS
        logs.bind_session(res.session.public_id)
        self._n_messages = len(req.messages)
        session = res.session
        session.inflight += 1
        try:
            await self._prepare(req, res, session, large)
        except BaseException:
            self._release()
            raise
        return self

    async def _resolve(self, req: TurnRequest, explicit: str | None) -> Resolution:
        """The session and turn the request continues. A session named by its id is matched by
        comparing the messages with its stored turns, and only the new messages are hashed; else
        the whole history is fingerprinted (off the event loop when it is large)."""
        core, messages = self.core, req.messages
        base = core.sessions.known_turn(messages, explicit, req.scope) if explicit is not None else None
        if base is not None:
            new = messages[base.n_messages :]
            weight = _text_chars(req, new)
            fp = (await core.offload.run(chain_fingerprint, base.fingerprint, new, key=req.scope, weight=weight)
                  if weight >= OFFLOAD_CHARS else chain_fingerprint(base.fingerprint, new))
            res = core.sessions.continue_turn(messages, explicit, req.scope, base, fp)
            if res is not None:
                return res
        weight = _text_chars(req)
        prints = await core.offload.run(fingerprints, messages, key=req.scope, weight=weight) if weight >= OFFLOAD_CHARS else None
        return core.sessions.resolve(messages, explicit, req.scope, prints)

    async def _prepare(self, req: TurnRequest, res: Resolution, session: Session, large: bool) -> None:
        core, renderer = self.core, self.core.renderer
        parser_name = "none" if (req.tool_choice == "none" or not req.tools) else core.settings.tool_parser
        parser = get_tool_parser(parser_name)
        forced = parser.forced_prefix(req.forced_tool) if req.tool_choice == "required" else None
        worker = self._session_worker(session, res)
        limit_worker = worker or core.workers.first()  # placement may still choose: any worker's limit
        await core.require_engine_info(limit_worker)
        limit = core.settings.max_prompt_tokens or limit_worker.capacity.max_req_input_len
        try:
            if large:
                ids = await core.offload.run(self._prompt_ids, req, res, forced, limit, key=req.scope)
            else:
                ids = self._prompt_ids(req, res, forced, limit)
        except TooManyTokens as exc:
            raise _too_long(f"at least {exc.at_least}", limit) from None
        if limit and len(ids) > limit:
            raise _too_long(str(len(ids)), limit)
        core.metrics.turns.labels(kind="continued" if res.base else ("new" if res.is_new_session else "branch")).inc()
        try:
            await core.policy.admit(session.id, len(ids), res.is_new_session, req.scope)
        except AdmissionRejected as exc:
            raise too_many(str(exc), exc.retry_after_s, exc.code) from None
        self._admitted = True
        if worker is None:  # placed by admission: the worker with room for it
            worker = core.workers.get(core.policy.worker_of(session.id))
            if worker is None:
                raise APIError(503, "no SGLang worker is available", type="engine_unavailable",
                               code="no_worker", headers={"Retry-After": "2"})
            await core.require_engine_info(worker)
        session.worker = worker  # its requests go there from now on
        now = time.monotonic()
        core.policy.on_request(session.id, len(ids), now)
        lease = self._lease = core.policy.lease_request(session.id, len(ids), now)
        params = sampling_params(req.sampling, core.settings.default_max_tokens, renderer.eos_ids, lease)
        salt = self._cache_salt(req, res)
        self._route = worker.generation_route()
        self.generation = Generation(
            self._route, generate_request(ids, session.id, params, salt), renderer.codec, parser, req.stop, forced,
            on_tokens=core.metrics.observe_tokens,
        )

    def _session_worker(self, session: Session, res: Resolution) -> Worker | None:
        """The worker holding the session's KV; None when placement must choose (a new session,
        or one whose worker was lost while another is usable: it is re-homed, and what the new
        worker recomputes of its history is counted once the turn is prefilled)."""
        core, worker = self.core, session.worker
        if worker is None:
            return core.workers.get(core.policy.worker_of(session.id))
        if worker.usable or not any(w.usable for w in core.workers if w is not worker):
            return worker
        session.worker = None
        session.rehomed += 1
        core.policy.relocate(session.id, None)
        core.metrics.sessions_rehomed.inc()
        self._rehomed_history = len(res.base.token_ids) if res.base is not None else 0
        log.warning("session %s: worker %s lost; it continues on another worker (its history is read back "
                    "where the workers share L3 storage, else recomputed)", session.public_id, worker.url)
        return None

    def _cache_salt(self, req: TurnRequest, res: Resolution) -> str | None:
        """The SGLang cache namespace of this request: with auth on and cache isolation, its key's
        scope, or the one shared namespace when it starts with the declared shared system prompt
        (then cached_tokens show only what the key's own history or that whole block explain)."""
        core = self.core
        if not req.scope or not core.settings.cache_isolation:
            return None
        first = req.messages[0] if req.messages else {}
        if core.shared_prefix is None or first.get("role") != "system" or first.get("content") != core.shared_prefix:
            return req.scope
        own = len(res.base.token_ids) if res.base is not None else 0
        block = core.renderer.system_block_ids(req.messages, req.tools, req.template_kwargs) if not own else None
        self._cached_view = (own, len(block) if block else 0)
        return SHARED_CACHE_SALT

    def _prompt_ids(self, req: TurnRequest, res: Resolution, forced: str | None, limit: int) -> IdText:
        """The engine's ids of the previous turn + only the new messages, or the whole history,
        then the forced tool-call prefix; TooManyTokens past ``limit`` (0: none), known before
        tokenizing where the text's length alone tells (``TokenCodec.check_fits``)."""
        renderer = self.core.renderer
        if res.base is not None:
            new = req.messages[res.new_messages_from :]
            room = max(limit - len(res.base.token_ids), 1) if limit else 0
            try:
                ids = res.base.token_ids + renderer.render_suffix(new, res.base.end_id, req.tools, req.template_kwargs, room)
            except TooManyTokens as exc:
                raise TooManyTokens(exc.at_least + len(res.base.token_ids), limit) from None
        else:
            ids = IdText(renderer.render_full(req.messages, req.tools, req.template_kwargs, limit))
        if forced is not None:
            ids += renderer.encode(forced)
        return ids

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            self.generation.close()
            first_token_at = self.generation.result.first_token_at
            if first_token_at is not None:  # also for a turn that failed after its first token
                self.core.metrics.ttft.observe(first_token_at - self.started_at)
            if self._rehomed_history:
                self._count_rehome(first_token_at is not None)
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
        if self._route.served_by is not None:
            self._served_elsewhere(self._route.served_by, len(res.base.token_ids) if res.base is not None else 0)
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

    def _count_rehome(self, prefilled: bool) -> None:
        """What the new worker of a re-homed session did with its history: what it found cached
        (read back from L3 storage the workers share, or a prefix it held) is restored, the rest
        recomputed; a turn that failed before its prefill counts it all as recomputed."""
        history, metrics = self._rehomed_history, self.core.metrics
        restored = min(self.generation.result.cached_tokens, history) if prefilled else 0
        metrics.rehomed_restored_tokens.inc(restored)
        metrics.rehomed_recompute_tokens.inc(history - restored)

    def _served_elsewhere(self, url: str, history_tokens: int) -> None:
        """smg served the turn on another worker than the session's (see ``WorkerRoute``): its KV
        is there now, so the session moves there; its history, sent to a worker that did not hold
        it, counts as a re-home's recompute, and the old worker's lease is let go."""
        core, session = self.core, self.resolution.session
        worker = core.workers.get(url)
        core.metrics.turns_served_elsewhere.inc()
        core.metrics.rehomed_recompute_tokens.inc(history_tokens)
        if worker is None:
            log.warning("session %s: smg served a turn on %s, a worker the sidecar does not know", session.public_id, url)
            return
        log.warning("session %s: smg served its turn on %s instead of %s; the session moves there",
                    session.public_id, url, session.worker.url)
        session.worker.release(session.id)
        session.worker = worker
        session.rehomed += 1
        core.metrics.sessions_rehomed.inc()
        core.policy.relocate(session.id, url)

    def _release(self) -> None:
        session = self.resolution.session
        session.inflight -= 1
        if self._admitted:
            self.core.policy.release_admission(session.id)
        if not session.turns and not session.inflight and not session.explicit:
            self.core.sessions.forget(session, "failed")  # a first request that failed leaves nothing behind


COUNT_TOKENS_LIMIT = 1 << 18  # count_tokens' limit while no worker has told its own

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


SHARED_CACHE_SALT = "shared"  # never a scope (those are 16 hex digits)


def _visible_cached(cached: int, own: int, block: int) -> int:
    """cached_tokens as a key may see them in the shared namespace: its own history, and the
    shared system block only when all of it was cached. A partial match of the block (or of
    anything past it) could be another key's text, read out a token at a time."""
    if block and cached >= block:
        return min(cached, max(own, block))
    return min(cached, own)


def _read_shared_prefix(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read shared_prefix_file {path}: {exc}") from None
    return text[:-1] if text.endswith("\n") else text


def _text_chars(req: TurnRequest, messages: list[dict] | None = None) -> int:
    """What preparing a request costs, all fields counted (``sidecar.turn.offload.request_weight``);
    ``messages`` narrows it to the messages a continuing turn renders (its new ones)."""
    return request_weight(req.messages if messages is None else messages, req.tools, req.template_kwargs)


def _too_long(count: str, limit: int) -> APIError:
    return invalid_request(
        f"prompt is {count} tokens, more than the limit of {limit}", param="messages", code="context_length_exceeded"
    )
