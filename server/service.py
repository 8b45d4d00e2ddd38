"""The server's shared state: sandbox pool, instance cache, HTTP episodes, the session cap, the salt.

One ``Service`` per process. WebSocket episodes live in OpenEnv's per-connection environments;
HTTP episodes live here, keyed by a 128-bit server-issued ``episode_id``. Both count against one cap
(``ws_count`` is wired to OpenEnv's session table by ``app.py``). Idle HTTP episodes are reaped by a
thread, which kills their workers. Nothing here knows about HTTP or OpenEnv.

Why per-client quotas live here: HTTP episodes and OpenEnv sessions (WebSocket and ``/mcp``) share one
cap, so one client's share of it must count both. ``owners`` maps every session key (an HTTP
``episode_id`` or an OpenEnv session id) to its ``Client``; ``admit`` checks the quota and holds a
placeholder while the session is being created, so two concurrent creations cannot both slip through.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import BENCHMARK_VERSION
from ..results import RunInfo
from ..settings import REPLICA_ID
from ..tasks import LEVELS, families, get_family
from ..torch_threads import configure_torch_threads
from .clients import LOCAL, Client
from .episode import Episode, EpisodeError, InfraFailure, ServiceUnavailable
from .generator_pool import GeneratorPool
from .generator_process import GeneratorProcess
from .instance_cache import CachedInstance, InstanceCache
from .prefetch import Pair, Prefetcher
from .runs import Runs
from .sandbox import SandboxPool, SandboxSettings, SandboxUnavailable
from .settings import ServerSettings
from .splits import SPLITS, TRAIN_SEED_LIMIT, InstanceRef, heldout_ref, practice_ref, train_ref

log = logging.getLogger("mechsandbox.server")

FINISHED_KEEP_S = 120.0  # a finished HTTP episode stays readable through /state this long
RESET_FIELDS = ("task_id", "seed", "level", "task_level", "split", "index", "run_token", "resume_token", "resume",
                "episode_id")  # fmt: skip
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class CapacityError(InfraFailure):
    """The server (or this client's share of it) is full: nothing was started or claimed; retry later."""

    status = 429
    side = "capacity"


class NothingToResume(EpisodeError):
    """A resume that names no episode this client may take back (unknown, expired, or another client's)."""

    status = 404


def resume_token_of(params: dict[str, Any]) -> str:
    """The client's own resume token for a new episode (``resume_token``), checked, or a fresh one from the server.

    Why a client may choose it: a reset whose reply is lost (the connection dropped while the instance was generated)
    has already claimed a counted attempt; with a token it chose before sending, the client can still resume it."""
    token = params.get("resume_token")
    if token is None:
        return secrets.token_urlsafe(24)
    if not isinstance(token, str) or not 32 <= len(token) <= 128 or not set(token) <= TOKEN_CHARS:
        raise EpisodeError("resume_token must be 32 to 128 characters of A-Z, a-z, 0-9, - and _ (or left out)")
    return token


class RateLimited(EpisodeError):
    status = 429


class UnknownEpisode(EpisodeError):
    status = 404


class MisdirectedEpisode(EpisodeError):
    """An episode id tagged for another replica: the load balancer did not route it by its tag (deploy/)."""

    status = 421


class Service:
    def __init__(self, settings: ServerSettings | None = None, sandbox: SandboxSettings | None = None):
        # One intra-op torch thread unless the operator chose (OMP_NUM_THREADS): on a busy machine torch's default of
        # a thread per core spins against everything else (a copy-head generation 0.90 s against 0.14 s beside CPU
        # hogs, docs/PERFORMANCE.md); the generator children read the count from here. Gym and the examples do the same.
        configure_torch_threads()
        self.settings = settings or ServerSettings.from_env()
        self.sandbox_settings = sandbox or SandboxSettings.from_env()
        self.pool = SandboxPool(self.sandbox_settings)
        self.generators = GeneratorPool(self.settings.generators)
        self.cache = InstanceCache(self.settings.cache_size, self.generators)
        build = GeneratorProcess() if self.settings.prefetch_process else CachedInstance.build
        self.prefetch = Prefetcher(self.settings.prefetch_depth, self.settings.prefetch_total,
                                   self.settings.prefetch_cpu_share, build)  # fmt: skip
        self.prefetch_pairs = self._pairs("prefetch_pairs")  # an unknown task fails here, before anything starts
        self.prewarm_pairs = self._pairs("prewarm_test")
        self.http: dict[str, Episode] = {}
        self.lock = threading.Lock()
        self.draining = threading.Event()
        self.refuse_from = float("inf")  # monotonic time from which a draining replica refuses new episodes
        self.opening = 0  # episodes being opened right now (past the draining check, not yet registered)
        self.episodes: weakref.WeakValueDictionary[str, Episode] = weakref.WeakValueDictionary()
        self.ws_count: Callable[[], int] = lambda: 0
        self.ws_ids: Callable[[], list[str]] = list  # OpenEnv's live session ids (wired by app.py)
        self.owners: dict[str, Client] = {}
        # every episode that can be resumed, by its resume token: live HTTP episodes, WebSocket episodes (attached or
        # parked after their connection went away) and finished ones until they are reaped (so a lost final reply can be
        # read back); ``parked`` holds the WebSocket episodes no connection holds now, until ``resume_grace_s``
        self.resumable: dict[str, Episode] = {}
        self.parked: dict[str, Episode] = {}
        self.starting: set[str] = set()  # resume tokens of resets under way (a resume of one is told to wait)
        self.stopped = threading.Event()
        if self.settings.test_salt:
            self.salt = self.settings.test_salt.encode()
            self.salt_is_random = False
        else:
            self.salt = secrets.token_bytes(32)
            self.salt_is_random = True
        self.runs = Runs(self.settings, self.salt, self.salt_is_random)

    # --- life cycle ----------------------------------------------------------------------------

    def start(self) -> Service:
        if self.salt_is_random:
            log.warning(
                "MECHSANDBOX_TEST_SALT is not set: a random test salt is in use, so test-split instances and "
                "results are NOT comparable across restarts or replicas. Set it for any leaderboard run."
            )
        self.runs.check_salt()  # a guessable fixed salt that is not declared public: WeakSalt, nothing started
        self.runs.open()
        self.pool.start()
        threading.Thread(target=self._reap_loop, name="episode-reaper", daemon=True).start()
        self._start_prefetch()
        return self

    def _start_prefetch(self) -> None:
        """The operator's pre-warm of the test split (into the instance cache) and pairs filled from the start."""
        jobs = []
        for task_id, level in self.prewarm_pairs:
            for index in range(min(self.settings.standard_set, self.settings.test_instances)):
                ref = heldout_ref(self.salt, task_id, level, index)
                jobs.append((ref.task_id, ref.seed, ref.level))
        if len(jobs) > self.settings.cache_size:
            log.warning("MECHSANDBOX_PREWARM_TEST names %d instances but MECHSANDBOX_CACHE_SIZE keeps %d: the first "
                        "ones will be evicted again", len(jobs), self.settings.cache_size)  # fmt: skip
        elif jobs:
            log.info("test-split pre-warm: %d instances in a cache of %d (train resets share it: raise "
                     "MECHSANDBOX_CACHE_SIZE to keep them)", len(jobs), self.settings.cache_size)  # fmt: skip
        if jobs:
            log.info("test-split pre-warm: generating %d instances in the background", len(jobs))
            self.prefetch.prewarm(jobs, self.cache.put)
        self.prefetch.start(self.prefetch_pairs)

    def _pairs(self, name: str) -> list[Pair]:
        pairs = []
        for pair in getattr(self.settings, name):
            task_id, _, level = pair.partition("/")
            try:
                pairs.append((get_family(task_id).id, level))
            except (KeyError, ValueError):
                raise ValueError(f"MECHSANDBOX_{name.upper()}: unknown task {task_id!r}") from None
        return pairs

    def stop(self) -> None:
        self.stopped.set()
        self.prefetch.stop(wait_s=10.0)
        self.generators.close()
        with self.lock:
            episodes = list(self.http.values()) + list(self.parked.values())
            self.http.clear()
            self.parked.clear()
            self.resumable.clear()
        for episode in episodes:
            episode.close(by_server=True)
        self.pool.close()
        self.runs.close()

    # --- episodes ------------------------------------------------------------------------------

    def resolve(self, params: dict[str, Any]) -> InstanceRef:
        """Validate reset parameters into an instance reference; one-line errors for the client."""
        unknown = sorted(set(params) - set(RESET_FIELDS))
        if unknown:
            raise EpisodeError(f"unknown reset fields {unknown}; allowed: {', '.join(RESET_FIELDS[:-1])}")
        task_id = params.get("task_id") or self.settings.default_task
        if not isinstance(task_id, str):
            raise EpisodeError("task_id must be a string such as 'dead-neurons'")
        try:
            family = get_family(task_id)
        except (KeyError, ValueError):
            known = ", ".join(f.id for f in families())
            raise EpisodeError(f"unknown task_id {task_id!r}; known: {known}") from None
        level = params.get("level") or params.get("task_level") or "easy"
        if level not in LEVELS:
            raise EpisodeError(f"level must be one of {list(LEVELS)}")
        split = params.get("split") or "train"
        if split not in SPLITS:
            raise EpisodeError(f"split must be one of {list(SPLITS)}")
        if split == "test":
            if params.get("seed") is not None:
                raise EpisodeError("test instances are chosen by index, not seed")
            index = params.get("index", 0)
            if type(index) is not int or not 0 <= index < self.settings.test_instances:
                raise EpisodeError(f"index must be an integer in [0, {self.settings.test_instances})")
            if params.get("run_token") is None and not self.salt_is_random:  # practice: never a counted instance
                return practice_ref(self.salt, family.id, level, index)
            return heldout_ref(self.salt, family.id, level, index)
        seed = params.get("seed")
        if seed is None:
            ready = self.prefetch.take(family.id, level)  # a fresh seed generated ahead, when one is ready
            if ready is not None:
                self.cache.put(ready)
                seed = ready.instance.seed
            else:
                seed = secrets.randbelow(TRAIN_SEED_LIMIT)
        if type(seed) is not int or not 0 <= seed < TRAIN_SEED_LIMIT:
            raise EpisodeError(f"seed must be an integer in [0, {TRAIN_SEED_LIMIT})")
        return train_ref(family.id, level, seed)

    def open_episode(self, params: dict[str, Any], transport: str, client: Client = LOCAL,
                     holder: Any = None) -> Episode:  # fmt: skip
        """A new episode; an HTTP one counts against ``client``'s quota (a WebSocket session already does). ``holder``:
        the WebSocket environment that will hold it (set before its resume token is published)."""
        token = resume_token_of(params)
        with self.lock:
            if token in self.resumable or token in self.starting:
                raise EpisodeError("resume_token is already in use; to take an episode back, reset with resume=<token>")
            self.starting.add(token)
        try:
            ref = self.resolve(params)
            episode = self._open_reference(ref, params, transport, client)
            episode.resume_token, episode.owner, episode.holder = token, client, holder
            with self.lock:
                self.resumable[token] = episode
            return episode
        finally:
            with self.lock:
                self.starting.discard(token)

    def _open_reference(self, ref: InstanceRef, params: dict[str, Any], transport: str, client: Client) -> Episode:
        try:
            return self._open_episode(ref, params, transport, client)
        except EpisodeError:
            if ref.split == "train" and params.get("seed") is None:
                # refused after resolve took a generated-ahead instance (full, over quota, sandbox down): it goes
                # back to its pool, so a client stuck at its cap cannot drain the pools for everyone
                self.prefetch.give_back(self.cache.peek(ref.task_id, ref.seed, ref.level))
            raise

    def _open_episode(self, ref: InstanceRef, params: dict[str, Any], transport: str, client: Client) -> Episode:
        run = self.runs.check_reset(ref, params.get("run_token"))
        with self.lock:  # the check and the count together: a drain never misses an episode being opened
            if time.monotonic() >= self.refuse_from:
                raise ServiceUnavailable("this replica is draining before it stops; start the episode again (a "
                                         "load balancer sends it to another replica)", "draining")  # fmt: skip
            self.opening += 1
        try:
            return self._admitted_episode(ref, params, transport, client, run)
        finally:
            with self.lock:
                self.opening -= 1

    def _admitted_episode(self, ref: InstanceRef, params: dict[str, Any], transport: str, client: Client,
                          run: RunInfo | None) -> Episode:  # fmt: skip
        if not self.pool.healthy():
            raise ServiceUnavailable("the sandbox is not available right now; retry shortly")
        if transport != "http":
            return self._scored(self._new_episode(ref, transport, behind=run is None), run)
        if self.total_sessions() >= self.settings.session_cap:
            raise CapacityError(f"the server is at its session cap ({self.settings.session_cap}); retry later")
        ticket = self.admit(client)
        try:
            return self._scored(self._new_episode(ref, transport, client, behind=run is None), run)
        finally:
            self.release(ticket)

    def _scored(self, episode: Episode, run: RunInfo | None) -> Episode:
        """Claim the run's attempt for a live episode (after every check that could still refuse it)."""
        try:
            episode.scoring = self.runs.scoring(episode.ref, run, episode.family.family_version)
        except EpisodeError:
            with self.lock:
                self.http.pop(episode.episode_id, None)
            episode.close()
            raise
        episode.recorder = self.runs.finish
        return episode

    def _new_episode(self, ref: InstanceRef, transport: str, client: Client = LOCAL, *, behind: bool) -> Episode:
        """The episode and its sandbox session. Loaded ``behind`` (docs/SANDBOX.md) unless it is a run's episode: an
        attempt is claimed at reset, so a counted episode's reset must fail (and claim nothing) when no worker can
        take its model, not a first step after the claim."""
        try:
            cached = self.cache.get(ref.task_id, ref.seed, ref.level)
        except Exception as exc:  # a generator that failed (a bug, a child that died twice): the server's fault
            log.exception("could not generate %s", ref.instance_id)
            raise InfraFailure(f"the instance could not be generated ({type(exc).__name__}); nothing was claimed",
                               "generation") from None  # fmt: skip
        try:
            sandbox = self.pool.open_session(cached.payload, behind=behind)
        except SandboxUnavailable as exc:
            raise ServiceUnavailable(str(exc)) from None
        episode = Episode(
            episode_id=self.new_episode_id(),
            ref=ref,
            family=get_family(ref.task_id),
            instance=cached.instance,
            sandbox=sandbox,
            reveal_truth=self.settings.reveal_truth,
            budget=self.settings.train_max_steps if ref.split == "train" else 0,
            transport=transport,
        )
        self.episodes[episode.episode_id] = episode
        if transport == "http":
            with self.lock:
                full = self._live_http() + self.ws_count() >= self.settings.session_cap
                if not full:
                    self.http[episode.episode_id] = episode
                    self.owners[episode.episode_id] = client
            if full:  # closed outside the service's lock, as everywhere else
                episode.close()
                raise CapacityError(f"the server is at its session cap ({self.settings.session_cap}); retry later")
        return episode

    # --- resuming after a dropped connection ----------------------------------------------------

    def resume(self, token: Any, client: Client, websocket: bool, holder: Any = None) -> tuple[Episode, Any]:
        """The episode ``token`` names, for ``client`` to take back: a WebSocket one parked since its connection went
        away (or still attached to a connection the client gave up on: it is detached from it), or an HTTP one.

        Only the client that opened it may (the token is a capability, and the client must match as well: its API
        token, or its address on a server without tokens). An unknown, expired or foreign token is one refusal, the
        same for all three, so a guess learns nothing. Returns the episode and the environment that held it before
        (``holder`` holds it from now on)."""
        if not isinstance(token, str) or not token:
            raise EpisodeError("resume must be the resume_token of the episode to take back")
        with self.lock:
            if token in self.starting:
                raise InfraFailure("the episode is still starting (its reset is under way); resume again in a moment",
                                   "generation")  # fmt: skip
            episode = self.resumable.get(token)
            mine = episode is not None and episode.owner == client and (episode.transport != "http") == websocket
            if not mine or not secrets.compare_digest(episode.resume_token, token):  # type: ignore[union-attr]
                raise NothingToResume("no episode to resume with that token: it ended and was reaped, its grace period "
                                      "(MECHSANDBOX_RESUME_GRACE_S) ran out, or another client opened it")  # fmt: skip
            if self.parked.pop(episode.episode_id, None) is not None:
                self.owners.pop(episode.episode_id, None)  # the resuming connection's session counts it from now on
            episode.parked_at = None
            previous, episode.holder = episode.holder, holder
        return episode, previous

    def park(self, episode: Episode, client: Client) -> None:
        """A WebSocket episode whose connection went away waits ``resume_grace_s`` for a resume, then closes (a counted
        one is then abandoned: the client did not come back). It keeps its worker and its place under the cap and in
        the client's quota while it waits; a finished one only keeps its last reply."""
        if self.settings.resume_grace_s <= 0 or self.stopped.is_set():
            self.forget(episode)
            episode.close(by_server=self.stopped.is_set())  # a server that is stopping ended it, not its client
            return
        episode.holder, episode.parked_at = None, time.monotonic()
        with self.lock:
            self.parked[episode.episode_id] = episode
            if not episode.done:
                self.owners[episode.episode_id] = client

    def forget(self, episode: Episode) -> None:
        with self.lock:
            if self.resumable.get(episode.resume_token) is episode:
                del self.resumable[episode.resume_token]
            self.parked.pop(episode.episode_id, None)

    def _reap_parked(self, now: float) -> list[Episode]:
        """Parked episodes past their grace; the caller holds ``self.lock`` and closes them outside it."""
        grace = self.settings.resume_grace_s
        expired = [e for e in self.parked.values() if e.parked_at is not None and now - e.parked_at > grace]
        for episode in expired:
            del self.parked[episode.episode_id]
            if self.resumable.get(episode.resume_token) is episode:
                del self.resumable[episode.resume_token]
        return expired

    # --- per-client quotas ---------------------------------------------------------------------

    def admit(self, client: Client) -> str:
        """A placeholder key held while ``client`` creates a session; CapacityError past its quota."""
        ticket = "pending:" + secrets.token_hex(8)
        with self.lock:
            held = self._held_by(client)
            quota = self.settings.client_quota()
            if not client.exempt and held >= quota:
                raise CapacityError(
                    f"this client already holds {held} sessions, its share of the session cap "
                    f"({quota} of {self.settings.session_cap}); close one or retry later"
                )
            self.owners[ticket] = client
        return ticket

    def bind(self, ticket: str, key: str) -> None:
        """The placeholder ``ticket`` becomes the session ``key`` (an OpenEnv session id)."""
        with self.lock:
            self.owners[key] = self.owners.pop(ticket, LOCAL)

    def release(self, ticket: str) -> None:
        with self.lock:
            self.owners.pop(ticket, None)

    def _held_by(self, client: Client) -> int:
        """Live sessions and placeholders of ``client``; forgets owners of sessions gone. Holds ``self.lock``."""
        live = {key for key, episode in self.http.items() if not episode.done}
        live.update(key for key, episode in self.parked.items() if not episode.done)
        live.update(self.ws_ids())
        for key in [k for k in self.owners if k not in live and not k.startswith("pending:")]:
            del self.owners[key]
        return sum(1 for owner in self.owners.values() if owner == client)

    def new_episode_id(self) -> str:
        """Random, and behind a load balancer ``<replica_id>.<random>``: the tag lets it route a ``/step`` back to
        the one replica that holds the episode (a hash of an opaque id could not; docs/DEPLOY.md)."""
        token = secrets.token_urlsafe(16)
        return f"{self.settings.replica_id}.{token}" if self.settings.replica_id else token

    def http_episode(self, episode_id: Any, client: Client | None = None) -> Episode:
        """The HTTP episode ``episode_id`` names, for ``client``: only the client that opened it may step or read it
        (its API token, or its address without tokens), as only the opener may use an MCP session or resume an
        episode; another client's id is answered exactly as an unknown one."""
        if not isinstance(episode_id, str) or not episode_id:
            raise EpisodeError("HTTP episodes need the episode_id returned by /reset (or use the WebSocket at /ws)")
        with self.lock:
            episode = self.http.get(episode_id)
        if episode is not None and (client is None or episode.owner is None or episode.owner == client):
            return episode
        if episode is not None:
            raise UnknownEpisode("unknown or expired episode_id; call /reset to start an episode")
        tag, dot, _ = episode_id.partition(".")
        if dot and tag != self.settings.replica_id and REPLICA_ID.fullmatch(tag):
            here = f"replica {self.settings.replica_id!r}" if self.settings.replica_id else "an untagged server"
            raise MisdirectedEpisode(f"episode_id belongs to replica {tag!r} but reached {here}: that replica is "
                                     "down or the load balancer does not route by the id's tag")  # fmt: skip
        raise UnknownEpisode("unknown or expired episode_id; call /reset to start an episode")

    def close_http(self, episode_id: str) -> None:
        with self.lock:
            episode = self.http.pop(episode_id, None)
        if episode is not None:
            self.forget(episode)
            episode.close()

    def check_rate(self, episode: Episode) -> None:
        """At most ``rate_limit`` steps per second per session (off when 0)."""
        if self.settings.rate_limit <= 0:
            return
        now = time.monotonic()
        if now - episode.last_step_at < 1.0 / self.settings.rate_limit:
            raise RateLimited(f"more than {self.settings.rate_limit:g} steps per second in this session; slow down")
        episode.last_step_at = now

    def http_count(self) -> int:
        """Live HTTP episodes (finished ones stay readable through /state until reaped, but hold no worker)."""
        with self.lock:
            return self._live_http()

    def _live_http(self) -> int:
        """Unfinished HTTP episodes and parked WebSocket ones (both hold a worker outside OpenEnv's session table); the
        caller holds ``self.lock``."""
        return sum(1 for e in self.http.values() if not e.done) + sum(1 for e in self.parked.values() if not e.done)

    def total_sessions(self) -> int:
        return self.http_count() + self.ws_count()

    def _reap_loop(self) -> None:
        """Reap idle HTTP episodes; finished ones (kept only for /state) after at most FINISHED_KEEP_S."""
        grace = max(self.settings.resume_grace_s, 0.8)
        interval = max(0.2, min(5.0, self.settings.idle_timeout_s / 4, FINISHED_KEEP_S / 4, grace / 4))
        while not self.stopped.wait(interval):
            now = time.monotonic()
            cutoff, finished_cutoff = (
                now - self.settings.idle_timeout_s,
                now - min(self.settings.idle_timeout_s, FINISHED_KEEP_S),
            )
            with self.lock:
                idle = [
                    e
                    for e in self.http.values()
                    if not e.lock.locked() and e.last_activity < (finished_cutoff if e.done else cutoff)
                ]
                for episode in idle:
                    self.http.pop(episode.episode_id, None)
                    if self.resumable.get(episode.resume_token) is episode:
                        del self.resumable[episode.resume_token]
                expired = self._reap_parked(now)
            for episode in idle:
                log.info("reaped idle HTTP episode %s…", episode.episode_id[:6])
            for episode in expired:
                log.info("closed a WebSocket episode not resumed within its grace (%s…)", episode.episode_id[:6])
            for episode in idle + expired:
                # in its own thread: closing a counted attempt waits for a step that slipped in after the check
                threading.Thread(target=episode.close, name="episode-close", daemon=True).start()

    # --- public descriptions ---------------------------------------------------------------------

    def drain(self, notice_s: float | None = None) -> None:
        """Start draining: ``/health`` answers 503 ``draining`` and ``/ready`` 404 at once, so a load balancer's
        check takes this replica out of rotation; new episodes are still accepted for ``notice_s`` (default
        ``MECHSANDBOX_DRAIN_NOTICE_S``: the time the balancer needs to notice), then refused, while the live ones
        go on. ``main`` stops the server once none is live or after ``drain_s``."""
        notice_s = self.settings.drain_notice_s if notice_s is None else notice_s
        if not self.draining.is_set():
            with self.lock:
                self.refuse_from = time.monotonic() + notice_s
            self.draining.set()
            log.info("draining: new episodes refused in %.0f s; %d live episode(s) may finish", notice_s,
                     self.live_episodes())  # fmt: skip

    def live_episodes(self) -> int:
        """Episodes not over (HTTP and WebSocket alike, whether or not they hold a sandbox worker right now) and
        episodes being opened."""
        with self.lock:
            opening = self.opening
            episodes = list(self.episodes.values())
        return opening + sum(1 for e in episodes if not e.done and not e.sandbox.closed)

    def wait_drained(self, limit_s: float, poll_s: float = 0.2) -> bool:
        """True once no episode is live, False when ``limit_s`` ran out first."""
        deadline = time.monotonic() + limit_s
        while self.live_episodes() > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def state(self) -> str:
        """``draining``, ``healthy`` or ``unhealthy``: what a load balancer's check reads (``/ready``), without the
        rest of the health report."""
        return "draining" if self.draining.is_set() else "healthy" if self.pool.healthy() else "unhealthy"

    def health(self) -> dict[str, Any]:
        status = self.pool.status()
        return {
            "status": self.state(),
            "replica": self.settings.replica_id or None,
            "live_episodes": self.live_episodes(),
            "isolation": status["layers"],
            "isolation_active": status["active"],
            "landlock_abi": status["landlock_abi"],
            "memory_accounting": status["memory_accounting"],
            "worker_namespaces": status["worker_namespaces"],
            "sessions": {"http": self.http_count(), "websocket": self.ws_count(), "cap": self.settings.session_cap},
            "workers": {"warm": status["warm_workers"], "live": status["workers"], "loading": status["loads_behind"]},
            "memory_kills": status["memory_kills"],
            "zygote_restarts": status["zygote_restarts"],
            "benchmark_version": BENCHMARK_VERSION,
            "train_max_steps": self.settings.train_max_steps or "family budgets",
            "test_salt": "random (results not comparable across restarts)" if self.salt_is_random else
            "public (runs unranked)" if self.runs.salt_is_public else "fixed",
            "salt_fingerprint": self.runs.fingerprint,
            "results_database": self.runs.backend(),
            "prefetch": self.prefetch.status(),
            "generators": self.generators.status(),
            "runs_required": not self.salt_is_random and not self.settings.practice,
        }

    def tasks(self) -> dict[str, Any]:
        return {
            "benchmark_version": BENCHMARK_VERSION,
            "default_task": self.settings.default_task,
            "splits": list(SPLITS),
            "test_instances_per_level": self.settings.test_instances,
            "standard_set_per_level": min(self.settings.standard_set, self.settings.test_instances),
            "test_salt": "random" if self.salt_is_random else "public" if self.runs.salt_is_public else "fixed",
            "salt_fingerprint": self.runs.fingerprint,
            "runs_required": not self.salt_is_random and not self.settings.practice,
            "tasks": [f.card() for f in families()],
        }
