"""One pool of vLLM servers behind a router, per rank process (``--rollout-backend vllm``):
every ``--vllm-url`` server, or every one of the ``--vllm-num-servers`` servers Relax owns
(server k started by sampling rank k mod R, vllm_backend.py ``Owned``); under
``--fully-async`` rollout rank i of R pools only URLs (or owned servers) i, i+R, ...

    pool = ServerPool([client0, client1], [0, 1])   # the clients of the URLs, their entries
    answer = pool.complete(prompt, session=key, max_tokens=..., seed=..., ...)
    pool.load(version, lambda client: ...)          # each server in the pool loads version
    pool.served()                                   # the oldest version sampled, and where
    pool.record(tracker)                            # rollout/server<i>/... for the step
    pool.close()

Routing: a request goes to the server with the fewest requests in flight from this process,
each server taking at most ``cap`` at once (ceil(64 / servers): the sampler's 64 in flight
spread evenly), the lowest entry on a tie; a request naming a ``session`` (the key of an
episode's or agent session's turn cache, relax/rollout/generation/turn_cache.py) goes where
that session's first turn went, whose prefix cache holds its context, unless that server
left the pool. A slow server holds its requests longer, so it is given fewer.

Failures: a server that refuses a connection, resets it or does not answer within
--vllm-request-timeout (vllm_client.py ``ServerDown``) leaves the pool with one line on
stderr, and the request is sent again to another server with the same seed: the answer is
checked as every answer is (vllm_answers.py), and only an answer that came back counts, so
no sample is lost and none is counted twice. An answer that came back wrong (an HTTP error,
a malformed completion) still ends the run: it would be as wrong elsewhere. A server that
fails a weight update (:meth:`load`) leaves the pool too, instead of sampling stale weights.
Every :data:`HEALTH_EVERY_S` seconds the servers out of the pool are asked for ``/health``;
one that answers loads the weights the pool serves (the last :meth:`load`) and rejoins.
Weights streamed from memory (``load(..., streamed=True)``, vllm_collective.py) exist only
during a push, so there is nothing to catch up to in between: no server is asked, and a
server out of the pool rejoins at the NEXT :meth:`load` instead, which also runs on each
server of this process out of the pool that answers ``/health`` and puts it back once its
load and version check succeed (one line saying so).

When no server is left, the next request (or the update that emptied the pool) raises a
:class:`ServerError` naming the last failure: the run ends with that one line, exit 1. A
pool of one server (an owned one, or one URL) raises that server's own error, as before
pools: there is nowhere else to send the request. An owned server that died stays out (Relax
does not restart it; it never answers ``/health`` again).

Versions are checked, not assumed: after every load (an update's, a catch-up's) the server is
told the version it now serves (vLLM's ``POST /update_weight_version``) and asked which it
serves (``GET /weight_info``, :func:`confirm`); its answer is ``Member.version``. A server
that reports another version, or an answer that is not a version (vllm_answers.py
``weight_version``), missed the update: it leaves the pool as a failed load does, with one
line naming its URL, the version it reports and the one expected, and rejoins only once a
catch-up makes it report the pool's version. Each answer of :meth:`complete` carries the
version its server reported when the request was sent (``version``), which the sampler
records per row (``Rollout.policy_version``).

Not built: the version of each token: vLLM 0.32's ``/v1/completions`` answer
carries none (only its token-in-token-out route records weight version spans), so a response
is tagged with the version its server reported before it was sent.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from relax.agreement import GroupAgreement
from relax.rollout.backends.vllm.vllm_client import ServerDown, ServerError, healthy

HEALTH_EVERY_S = 2.0  # how often a server out of the pool is asked for /health
IN_FLIGHT = 64  # the sampler's requests at once (vllm_sampler.py MAX_IN_FLIGHT)


@dataclass
class Member:
    """One server of the pool: ``index`` its --vllm-url entry or owned server's number (its
    metrics' ``server<i>``), the counts since the last :meth:`ServerPool.record`."""

    client: object
    index: int
    in_pool: bool = True
    version: int = 0  # the weights version the server reported after its last load
    in_flight: int = 0
    peak: int = 0  # the most in flight since the last record
    requests: int = 0  # answers that came back
    failures: int = 0
    tokens: int = 0
    busy: list = field(default_factory=lambda: [None, None])  # first start, last end
    # one load at a time (a sync's and a catch-up's), the later one loading the newest weights
    loading: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return getattr(self.client, "url", f"server {self.index}")


class ServerPool:
    """``clients``: one per server (vllm_client.py ``VllmClient``, or anything with its
    methods); ``indices``: their --vllm-url entries or owned servers' numbers (default 0, 1,
    ...); ``cap``: the most requests in flight per server (default ceil(64 / servers))."""

    def __init__(self, clients: list, indices: list[int] | None = None, *,
                 cap: int | None = None, health_every: float = HEALTH_EVERY_S,
                 total: int | None = None):
        indices = list(range(len(clients))) if indices is None else list(indices)
        # the servers of every pool (other ranks' too): recorded by every rank, zeros for
        # the servers not here, since the metrics' reduction needs the same names
        self.total = total or max(indices) + 1
        self.members = [Member(c, i) for c, i in zip(clients, indices, strict=True)]
        self.cap = cap or max(1, math.ceil(IN_FLIGHT / len(clients)))
        self.health_every = health_every
        self.version = 0
        self.loader: Callable | None = None  # what the last load did to each server
        self.streamed = False  # the last load streamed its weights: no catch-up between loads
        self.sessions: dict[Hashable, Member] = {}
        self.last_failure = ""
        self.oldest: tuple[int, str] | None = None  # (version, URL): the oldest that sampled
        self.last_error: ServerError | None = None
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def of(cls, target) -> ServerPool | None:
        """``target`` as a pool: itself, a pool of that one client, or None (an owned server
        not started yet)."""
        if target is None or isinstance(target, ServerPool):
            return target
        return cls([target])

    @property
    def clients(self) -> list:
        return [m.client for m in self.members]

    def describe(self) -> str:
        if len(self.members) == 1:
            return self.members[0].client.describe()
        return f"the pool of {len(self.members)} vLLM servers"

    # ------------------------------------------------------------------ sampling
    def complete(self, prompt: list[int], *, session: Hashable | None = None, **request) -> dict:
        """One sampled response (``VllmClient.complete``'s keywords), from the server the
        routing picks; sent again elsewhere, with the same seed, when that server is down.
        The answer's ``version``: the weights version the server reported when the request
        was sent. vLLM 0.32's completion answer names no version, and a server's version
        changes only by a load, which pauses it letting the requests in flight finish on the
        weights they started with (vllm_sync.py); a request sent during a load's pause may
        run on the newer weights, so the version recorded is never newer than the one that
        sampled."""
        while True:
            member, version = self._acquire(session)
            start = time.perf_counter()
            try:
                answer = member.client.complete(prompt, **request)
            except ServerDown as e:
                self._release(member, start, failure=e)
                continue
            except BaseException:
                self._release(member, start)
                raise
            self._release(member, start, tokens=len(answer["token_ids"]), version=version)
            return {**answer, "version": version}

    def served(self) -> tuple[int, str] | None:
        """The oldest weights version that sampled an answer since the last call, and the
        URL of a server that sampled with it; None when nothing was sampled."""
        with self._cond:
            oldest, self.oldest = self.oldest, None
        return oldest

    def _acquire(self, session: Hashable | None) -> tuple[Member, int]:
        with self._cond:
            while True:
                live = [m for m in self.members if m.in_pool]
                if not live:
                    raise self._gone()
                member = self.sessions.get(session) if session is not None else None
                if member is None or not member.in_pool:
                    member = min(live, key=lambda m: m.in_flight)  # the first on a tie
                    if session is not None:
                        self.sessions[session] = member
                if member.in_flight < self.cap:
                    member.in_flight += 1
                    member.peak = max(member.peak, member.in_flight)
                    return member, member.version
                # a slot frees, or a server leaves or joins (the timeout only re-checks)
                self._cond.wait(timeout=self.health_every)

    def _release(self, member: Member, start: float, *, tokens: int = 0,
                 failure: ServerError | None = None, version: int | None = None) -> None:
        with self._cond:
            member.in_flight -= 1
            if failure is not None:
                member.failures += 1
                self._take_out(member, str(failure), failure)
            else:
                member.requests += 1
                member.tokens += tokens
                first = member.busy[0]
                member.busy = [start if first is None else first, time.perf_counter()]
                if version is not None and (self.oldest is None or version < self.oldest[0]):
                    self.oldest = (version, member.url)
            self._cond.notify_all()

    # ------------------------------------------------------------------ membership
    def _take_out(self, member: Member, why: str, error: ServerError) -> None:
        """Under the lock: ``member`` leaves the pool, said in one line (a pool of one server
        says nothing: its error ends the run, as it did before pools)."""
        if not member.in_pool:
            return
        member.in_pool = False
        self.last_failure, self.last_error = why, error
        if len(self.members) == 1:
            return
        left = sum(m.in_pool for m in self.members)
        print(f"relax: warning: vLLM server {member.url} left the pool ({why}); {left} of "
              f"{len(self.members)} left", file=sys.stderr, flush=True)
        if left and not self.streamed and (self._watcher is None
                                           or not self._watcher.is_alive()):
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name="relax-vllm-pool-health")
            self._watcher.start()
        self._cond.notify_all()

    def _gone(self) -> ServerError:
        if len(self.members) == 1 and self.last_error is not None:
            return self.last_error  # one line naming the server (and an owned one's log)
        urls = " ".join(m.url for m in self.members)
        return ServerError(f"every vLLM server of the pool ({urls}) is gone; the last "
                           f"failure: {self.last_failure}")

    def _watch(self) -> None:
        """Every ``health_every`` s: each server out of the pool that answers ``/health``
        loads the pool's weights and rejoins; ends once every server is back, the pool is
        closed or none is left."""
        while not self._closed.wait(self.health_every):
            with self._cond:
                out = [m for m in self.members if not m.in_pool]
                if not out or len(out) == len(self.members) or self.streamed:
                    return
            for member in out:
                self._try_rejoin(member)

    def _try_rejoin(self, member: Member) -> None:
        """``member`` back in the pool once it answers ``/health``, has loaded the pool's
        weights and reports their version."""
        if not healthy(member.url, timeout=self.health_every):
            return
        with member.loading:  # after a sync's load of this server, never under it
            with self._cond:
                loader, version = self.loader, self.version
            try:
                if loader is not None:  # a restarted server serves its start-up weights
                    loader(member.client)
                reported = confirm(member.client, version)
            except ServerError:
                return  # still out; asked again at the next round
        with self._cond:
            if self.version != version or self._closed.is_set() or self.streamed:
                return  # an update came meanwhile: load that one first
            self._put_back(member, reported)

    # ------------------------------------------------------------------ weights
    def load(self, version: int, load: Callable, *, catch_up: Callable | None = None,
             apply: Callable | None = None, mine: Callable[[int], bool] | None = None,
             group=None, device="cpu", streamed: bool = False,
             feed: Callable[[int], None] | None = None) -> None:
        """Each server in the pool runs ``load(client)`` (at once, one thread each) and
        serves ``version`` from then on, which it must then report (:func:`confirm`); one
        whose ``load`` or report raises a ServerError leaves the pool. ``catch_up(client)``:
        what a server out of the pool runs before it rejoins (default ``load``);
        ``apply(client)``: run here on every server that holds ``version`` after, whoever
        loaded it (the client's own state, such as the adapter's name). ``mine(index)``: the
        servers this process loads (None: all; ranks that pool the same servers load each
        once); ``group``: the ranks pooling the same servers, whose failures every rank hears
        of (one MAX all-reduce), so that they all take out the same ones. Another error is
        raised after that all-reduce; an empty pool raises its one line.

        ``streamed``: the weights exist only during this call (vllm_collective.py): no
        catch-up between loads; this process's servers out of the pool that answer
        ``/health`` load too and rejoin once they report ``version``. ``feed(n)``: run on this
        thread while the ``n`` loads run (the collective gathers that feed them), before the
        all-reduce, so that no two threads of a rank use ``group`` at once."""
        with self._cond:
            members = [m for m in self.members if m.in_pool]
            # set first: a catch-up from now on loads this version (the sync wrote it)
            self.loader, self.version = catch_up or load, version
            self.streamed = streamed
        own, back = self._to_load(members, mine, streamed)
        loads = _run_loads(own, load, version, feed)
        if group is not None:  # every rank takes out and puts back the same servers
            self._agree(loads.failures, group, device)
            if streamed:
                back = self._agree_back(back - set(loads.failures), group, device)
        empty = self._settle(members, back, version, loads, apply)
        if loads.fatal is not None:
            raise loads.fatal
        if empty:
            raise self._gone()

    def _to_load(self, members: list[Member], mine: Callable[[int], bool] | None,
                 streamed: bool) -> tuple[list[Member], set[int]]:
        """The servers this process loads (of :meth:`load`'s ``members``, those in the pool
        when it began), and the indices of those out of the pool that rejoin if they load
        (a streamed load only)."""
        # with ``mine`` a server is this process's to load even when out of its own pool: the
        # other ranks' pools may hold it and count on this load (the watcher rejoins it here)
        own = members if mine is None else [m for m in self.members if mine(m.index)]
        if not streamed:
            return own, set()
        # a server out of the pool rejoins now or at a later load
        own = [m for m in own if m.in_pool] + [
            m for m in self.members if not m.in_pool and (mine is None or mine(m.index))
            and healthy(m.url, timeout=self.health_every)]
        return own, {m.index for m in own if not m.in_pool}

    def _settle(self, members: list[Member], back: set[int], version: int, loads: _Loads,
                apply: Callable | None) -> bool:
        """One step under the lock, as the requests see it: each of ``members`` (in the pool
        when the load began) that failed leaves it; the others, and each server of ``back``
        that did not fail, serve ``version``, ``apply`` run on them. Whether the pool is
        empty now."""
        failures, reported = loads.failures, loads.reported
        with self._cond:
            self.sessions.clear()  # the reload dropped every prefix cache
            for m in members:
                if m.index in failures:
                    m.failures += 1
                    self._take_out(m, f"missed the update to weights version {version}: "
                                      f"{failures[m.index]}", failures[m.index])
                else:  # what it reported (a server another rank loaded: that rank checked it)
                    m.version = reported.get(m.index, version)
                    if apply is not None:
                        apply(m.client)
            for m in self.members:
                if m.index in back and m.index not in failures and not m.in_pool:
                    self._put_back(m, reported.get(m.index, version))
                    if apply is not None:
                        apply(m.client)
            return not any(m.in_pool for m in self.members)

    def _put_back(self, member: Member, version: int) -> None:
        """Under the lock: ``member`` rejoins at ``version``, said in one line."""
        member.in_pool, member.version = True, version
        left = sum(m.in_pool for m in self.members)
        print(f"relax: vLLM server {member.url} rejoined the pool at weights version "
              f"{version}; {left} of {len(self.members)} in it", file=sys.stderr, flush=True)
        self._cond.notify_all()

    def announce(self, version: int) -> None:
        """Every server of the pool told it serves ``version`` (the start-up weights, which
        no load put there) and checked to report it; a ServerError for the first that
        does not."""
        for m in self.members:
            confirmed = confirm(m.client, version)
            with self._cond:
                m.version = confirmed

    def _agree(self, failures: dict[int, ServerError], group, device) -> None:
        """Add to ``failures`` the servers another rank of ``group`` failed to load (one MAX
        all-reduce of a flag per server)."""
        flags = torch.zeros(len(self.members), device=device)
        for k, m in enumerate(self.members):
            flags[k] = float(m.index in failures)
        flags = GroupAgreement(group, device).reduce(flags, dist.ReduceOp.MAX)
        for k, m in enumerate(self.members):
            if flags[k] and m.index not in failures:
                failures[m.index] = ServerError(f"{m.client.describe()}: its update failed "
                                                "on another rank")

    def _agree_back(self, back: set[int], group, device) -> set[int]:
        """The servers out of the pool that some rank of ``group`` loaded at this streamed
        load (one MAX all-reduce): every rank puts them back."""
        flags = torch.tensor([float(m.index in back) for m in self.members], device=device)
        flags = GroupAgreement(group, device).reduce(flags, dist.ReduceOp.MAX)
        return {m.index for k, m in enumerate(self.members) if flags[k]}

    # ------------------------------------------------------------------ metrics
    def record(self, tracker) -> None:
        """This step's ``rollout/server<i>/...`` (then the counts restart): ``requests``
        answered, ``failures`` (requests and updates), ``in_flight`` (the most at once),
        ``tokens_per_s`` (sampled tokens over the span from the first request's start to the
        last answer; summed over the ranks sharing the server), ``in_pool`` (the share of
        ranks holding it) and ``weight_version``; zeros for the entries of other ranks'
        pools (every rank records the same names)."""
        here = {m.index for m in self.members}
        for index in sorted(set(range(self.total)) - here):
            record_server(tracker, index, {})
        with self._cond:
            for m in self.members:
                first, last = m.busy
                span = (last - first) if first is not None else 0.0
                record_server(tracker, m.index, {
                    "requests": m.requests, "failures": m.failures, "in_flight": m.peak,
                    "tokens_per_s": m.tokens / span if span > 0 else 0.0,
                    "in_pool": float(m.in_pool), "weight_version": m.version})
                m.requests = m.failures = m.tokens = 0
                m.peak, m.busy = m.in_flight, [None, None]

    def close(self) -> None:
        """The health checks stop (within one round)."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=self.health_every + 6.0)


def _locked(lock: threading.Lock, call: Callable, *args):
    with lock:
        return call(*args)


def confirm(client, version: int) -> int:
    """Tell the server behind ``client`` that it serves ``version`` and read back the version
    it reports (``VllmClient.set_weight_version``, ``weight_version``): ``version``, or a
    ServerError naming the server, the version it reports and the one expected (it missed
    the update: a proxy sending the routes to different servers, a restart in between)."""
    client.set_weight_version(version)
    reported = client.weight_version()
    if reported != version:
        raise ServerError(f"{client.describe()} reports weights version {reported} after the "
                          f"update to version {version}")
    return reported


def _load_confirmed(load: Callable, client, version: int) -> int:
    load(client)
    return confirm(client, version)


@dataclass
class _Loads:
    """What the loads of one :meth:`ServerPool.load` on this process came to, by server
    index: the version each reported, each one's ServerError, and the first other error
    (raised once every rank has heard of the failures)."""

    reported: dict[int, int] = field(default_factory=dict)
    failures: dict[int, ServerError] = field(default_factory=dict)
    fatal: Exception | None = None


def _run_loads(own: list[Member], load: Callable, version: int,
               feed: Callable[[int], None] | None) -> _Loads:
    """``load`` then :func:`confirm` on each of ``own``, one thread each, each under its
    server's lock; ``feed(len(own))`` on this thread meanwhile. Waits for every load."""
    out = _Loads()
    with ThreadPoolExecutor(max_workers=max(1, len(own))) as threads:
        futures = [(m, threads.submit(_locked, m.loading, _load_confirmed, load, m.client,
                                      version)) for m in own]
        if feed is not None:
            try:
                feed(len(own))
            except Exception as e:  # noqa: BLE001 - load raises it after the all-reduce
                out.fatal = e
        for m, f in futures:
            try:
                out.reported[m.index] = f.result()
            except ServerError as e:
                out.failures[m.index] = e
            except Exception as e:  # noqa: BLE001 - load raises it after the all-reduce
                out.fatal = out.fatal or e
    return out


SERVER_METRICS = ("requests", "failures", "in_flight", "tokens_per_s", "in_pool",
                  "weight_version")


def record_server(tracker, index: int, values: dict) -> None:
    """``rollout/server<index>/...`` of :data:`SERVER_METRICS`: ``values`` (absent: 0, and
    ``in_pool`` counts no rank); sums but ``in_flight`` and ``weight_version`` (the most
    over ranks) and ``in_pool`` (a ratio over the ranks that pool the server)."""
    name = f"rollout/server{index}/"
    for key in ("requests", "failures", "tokens_per_s"):
        tracker.add_sum(name + key, values.get(key, 0.0))
    for key in ("in_flight", "weight_version"):
        tracker.add_max(name + key, values.get(key, 0.0))
    tracker.add_ratio(name + "in_pool", values.get("in_pool", 0.0), 1.0 if values else 0.0)
