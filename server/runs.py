"""Runs on the test split: registration, which episode of an instance counts, and writing results as they end.

Why an attempt is claimed at reset, not at submission: the rule is that only a run's first attempt at a test
instance counts. Were the claim made at the first graded submission, an agent could reset an instance, probe it
for its whole step budget, walk away, and come back with a fresh budget as often as it liked; claimed at reset,
the first episode of an instance is *the* attempt, and leaving it unfinished counts at the floor. Every later
episode of the same instance in the same run is played (the agent may study it) but neither scored nor rewarded
above the floor, and its observations say ``counted: false``, so the reward is no oracle.

Who may play the test split without a run: on a server with a random salt (a development server, the one
``mechsandbox eval`` starts), anyone, scored as before, since nothing there is comparable. On a server with a
fixed salt (a hosted benchmark), nobody, unless the operator turns on practice, whose scores are never shown.

Why a counted attempt's score is sealed on a fixed-salt server (issue 55): one look per run, times many runs, is
still an oracle (a bisection over the candidate answers needs one run per look). So the agent gets the floor and
``done``, every route shows the run's coverage only, and the run's scores appear when it is finished, and then only
as dithered aggregates (``results.leaderboard.publish``) computed once and stored: a finished run is immutable.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import logging
import math
import string
import threading
import time
from collections.abc import Iterator
from typing import Any

from .. import BENCHMARK_VERSION
from ..protocol import FLOOR
from ..results import ResultStore, ResultsUnavailable, RunInfo, leaderboard, resolve_database_url
from ..results.leaderboard import dither_for, publish
from ..results.store import client_hash
from ..tasks import LEVELS, families
from .clients import Client
from .episode import EpisodeError, InfraFailure
from .scoring import Scoring
from .settings import ServerSettings
from .splits import InstanceRef, salt_fingerprint

log = logging.getLogger("mechsandbox.server")

BOARD_TTL_S = 5.0  # how stale GET /leaderboard may be about other replicas' writes
MIN_SALT_BITS = 128  # estimated entropy below which a fixed salt that is not declared public refuses to start
# Salts the project itself publishes (the calibration command in README.md and docs/PERFORMANCE.md): public whatever
# the operator says, so their runs are never ranked.
PUBLISHED_SALTS = ("mechsandbox-calibration-2026",)
# The alphabets a salt's characters are counted from (any other character adds itself): lower, upper, digits, the
# rest of printable ASCII.
ALPHABETS = (string.ascii_lowercase, string.ascii_uppercase, string.digits, string.punctuation + " ")


def salt_bits(text: str) -> float:
    """An estimate of a salt's entropy in bits: its length times log2 of the size of the alphabets its characters
    come from (a 43-character base64 token: about 280; 64 hex digits: 330; an 8-letter word: 38).

    Why this estimate: it is what brute force over the salt's character classes costs, so it refuses what an
    attacker enumerates first (short salts, small alphabets). It is an upper bound: a passphrase of dictionary words
    scores as random letters would, so the docs still ask for a random salt (``secrets.token_urlsafe(32)``)."""
    alphabet = sum(len(chars) for chars in ALPHABETS if any(c in chars for c in text))
    alphabet += len({c for c in text if not any(c in chars for chars in ALPHABETS)})
    return len(text) * math.log2(alphabet) if alphabet > 1 else 0.0


class WeakSalt(ValueError):
    """A fixed test salt too guessable to start with (and not declared public); the message is one line."""


class RunRefused(EpisodeError):
    """A run-related refusal that is the client's to fix (unknown token, a run where none is allowed...)."""

    status = 403


class ResultsDown(InfraFailure):
    """The results database failed: nothing was counted or lost; retry."""

    side = "database"


class RunQuota(EpisodeError):
    status = 429


DOWN = "the results database is unavailable right now; nothing was counted or lost: retry shortly"


@contextlib.contextmanager
def database() -> Iterator[None]:
    """Turn a database failure into a 503 whose text says nothing of the database (the log has the details)."""
    try:
        yield
    except ResultsUnavailable as exc:
        log.warning("results database: %s", exc)
        raise ResultsDown(DOWN) from None


def quota_key(client_key: str) -> str:
    """Whom the registration quota counts: an IPv6 client by its /64 (one subscriber's usual allocation)."""
    if client_key.startswith("addr:"):
        try:
            address = ipaddress.ip_address(client_key[5:])
        except ValueError:
            return client_key
        if address.version == 6:
            return f"addr:{ipaddress.ip_network(f'{address}/64', strict=False)}"
    return client_key


def parse_submitters(text: str, tokens: tuple[str, ...]) -> dict[str, str]:
    """``MECHSANDBOX_SUBMITTERS`` (``name=tokA,tokB;other=tokC``) as {client key: submitter name}; the client key of a
    token is ``token#<its index among the accepted tokens>`` (``clients.ClientIdentifier``). A token that is not
    accepted, or a malformed group, is a ValueError in one line (the server refuses to start)."""
    groups: dict[str, str] = {}
    for part in (p.strip() for p in text.split(";") if p.strip()):
        name, _, members = part.partition("=")
        name = name.strip()
        if not name or not members.strip() or len(name) > 40 or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"MECHSANDBOX_SUBMITTERS: {part[:40]!r} is not name=token,token (a name of letters, "
                             "digits, - and _)")  # fmt: skip
        for token in (t.strip() for t in members.split(",") if t.strip()):
            if token not in tokens:
                raise ValueError(f"MECHSANDBOX_SUBMITTERS: submitter {name!r} names a token that is not in "
                                 "MECHSANDBOX_API_TOKENS")  # fmt: skip
            groups[f"token#{tokens.index(token)}"] = name
    return groups


class Runs:
    """The server's side of runs: one per ``Service``, over one ``ResultStore``."""

    def __init__(self, settings: ServerSettings, salt: bytes, salt_is_random: bool):
        self.settings = settings
        self.salt_is_random = salt_is_random
        self.secret = salt  # keys the published aggregates' dither (``results.leaderboard.dither_for``)
        self.groups = parse_submitters(settings.submitters, settings.tokens)
        self.fingerprint = salt_fingerprint(salt)
        # a public salt's test set is anyone's to derive: its runs are listed, never ranked
        self.salt_is_public = not salt_is_random and (settings.public_salt or settings.test_salt in PUBLISHED_SALTS)
        self.public_fingerprints = {salt_fingerprint(s.encode()) for s in PUBLISHED_SALTS}
        if self.salt_is_public:
            self.public_fingerprints.add(self.fingerprint)
        self.store: ResultStore | None = None
        self.board: tuple[float, int, dict[str, Any]] | None = None  # (read at, write count then, board)
        self.writes = 0  # results written through this server
        self.board_lock = threading.Lock()
        self.compute_lock = threading.Lock()

    def open(self) -> None:
        """Open (and migrate) the results database; ``ResultsUnavailable`` in one line when it cannot be."""
        if self.store is not None:
            return
        url, note, cleanup = resolve_database_url(self.settings.database_url, self.settings.data_dir,
                                                  self.salt_is_random)  # fmt: skip
        if note:
            log.warning(note)
        store = ResultStore(url, cleanup=cleanup)
        try:
            store.open()
        except ResultsUnavailable:
            store.close()
            raise
        self.store = store
        log.info("results database: %s", store.describe())

    def backend(self) -> str:
        """``sqlite`` or ``postgresql`` (never the URL: it may hold a password); ``closed`` before start."""
        return self.store.backend if self.store is not None else "closed"

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def _store(self) -> ResultStore:
        if self.store is None:
            raise ResultsDown(DOWN)
        return self.store

    # --- registration --------------------------------------------------------------------------

    def submitter(self, client: Client) -> tuple[str, str]:
        """``(quota key, public name)`` of the submitter a client is: an operator's group of tokens by its name, a
        token by its index, an address by a hash of it (its /64 for IPv6; the leaderboard never shows an address).
        Loopback is a submitter like any other: the quota binds it too (issue 55)."""
        if client.key in self.groups:
            name = self.groups[client.key]
            return f"submitter:{name}", name
        key = quota_key(client.key)
        if key.startswith("token#"):
            return key, key
        return key, f"client-{client_hash(key)[:10]}"

    def register(self, agent: str, model: str, notes: str, client: Client) -> dict[str, Any]:
        store = self._store()
        quota = self.settings.run_quota
        standard = min(self.settings.standard_set, self.settings.test_instances)
        key, name = self.submitter(client)
        with database():
            made = store.register_run(agent, model, notes, key, self.fingerprint, BENCHMARK_VERSION, standard, quota,
                                      submitter=name)  # fmt: skip
        self._changed()
        if made is None:
            raise RunQuota(f"submitter {name} registered {quota} runs today (UTC), the server's quota "
                           "(MECHSANDBOX_RUN_QUOTA); play the runs you have")  # fmt: skip
        run, token = made
        log.info("registered %s (agent %r, submitter %s)", run.run_id, run.agent, name)
        return {
            "run_id": run.run_id,
            "run_token": token,
            "submitter": name,
            "sealed": not self.salt_is_random,
            "salt_fingerprint": self.fingerprint,
            "benchmark_version": BENCHMARK_VERSION,
            "standard_set": {
                "instances_per_level": run.standard_set,
                "levels": list(LEVELS),
                "tasks": [f.id for f in families()],
            },
        }

    # --- which episodes count ------------------------------------------------------------------

    def check_reset(self, ref: InstanceRef, run_token: Any) -> RunInfo | None:
        """The run a reset plays for (None for none), or a one-line refusal; claims nothing yet."""
        if run_token is None:
            if ref.split == "test" and not self.salt_is_random and not self.settings.practice:
                raise RunRefused(
                    "test-split resets on this server need a run_token: register a run with POST /runs "
                    "(the operator can allow run-less practice with MECHSANDBOX_PRACTICE=true)"
                )
            return None
        if not isinstance(run_token, str) or not 0 < len(run_token) <= 128:
            raise EpisodeError("run_token must be the string POST /runs returned")
        if ref.split != "test":
            raise EpisodeError("run_token is for the test split only (train episodes are never counted)")
        with database():
            run = self._store().run_for_token(run_token)
        if run is None:
            raise RunRefused("unknown run_token; register a run with POST /runs")
        if run.salt_fingerprint != self.fingerprint:
            raise RunRefused(f"{run.run_id} was registered on a server with another test salt "
                             f"({run.salt_fingerprint}, this one is {self.fingerprint})")  # fmt: skip
        if run.finished_at is not None:
            raise RunRefused(f"{run.run_id} is finished (its published result never changes); register a new run")
        if not 0 <= int(ref.index or 0) < run.standard_set:
            raise EpisodeError(f"a run plays the standard set: index below {run.standard_set} "
                               "(other test instances are not part of any run)")  # fmt: skip
        return run

    def scoring(self, ref: InstanceRef, run: RunInfo | None, family_version: str) -> Scoring:
        """Claim the run's attempt at ``ref`` if it has none yet; how this episode's end is scored.

        A reset of an instance the run already claimed is a replay, and it ends the claimed attempt if that is
        still open (abandoned, at the floor): an agent cannot keep its counted episode waiting while it probes the
        same instance in replays with fresh step budgets.
        """
        if ref.split != "test":
            return Scoring()
        if run is None:
            return Scoring() if self.salt_is_random else Scoring("practice", reason="practice episode (no run)")
        store = self._store()
        with database():
            attempt_id = store.claim(run.run_id, ref.task_id, family_version, ref.level, int(ref.index or 0),
                                     ref.instance_id)  # fmt: skip
            abandoned = attempt_id is None and store.abandon(run.run_id, ref.instance_id, FLOOR)
        if abandoned:
            log.info("%s reset an instance again: its open attempt there is abandoned", run.run_id)
        if attempt_id is not None or abandoned:
            self._changed()
        if attempt_id is None:
            return Scoring("uncounted", run.run_id, reason=f"{run.run_id} already attempted this instance")
        return Scoring("counted", run.run_id, attempt_id, sealed=not self.salt_is_random)

    def finish(self, scoring: Scoring, status: str, score: float | None, steps: int, seconds: float,
               trajectory: list[dict[str, Any]]) -> bool:  # fmt: skip
        """Write a counted attempt's end: False when it was no longer open; ResultsDown when the database fails."""
        if scoring.mode != "counted" or scoring.attempt_id is None:
            return False
        with database():
            store = self._store()
            kept = store.finish(scoring.attempt_id, status, FLOOR if score is None else score, steps, seconds,
                                trajectory)  # fmt: skip
        self._changed()
        if kept and scoring.run_id is not None:
            self._finish_if_complete(scoring.run_id)
        return kept

    def _finish_if_complete(self, run_id: str) -> None:
        """A run whose whole standard set has ended is finished by itself (its result is published at once)."""
        with database():
            store = self._store()
            run = store.run(run_id)
            if run is None or run.finished_at is not None:
                return
            wanted = len(families()) * len(LEVELS) * run.standard_set
            done = store.finished_attempts(run_id) >= wanted
        if done:
            self._publish(run)

    # --- finishing and withdrawing -------------------------------------------------------------

    def _own_run(self, run_id: str, run_token: Any) -> RunInfo:
        """The run ``run_token`` is the token of, which must be ``run_id``; a one-line 403/404 otherwise."""
        if not isinstance(run_token, str) or not 0 < len(run_token) <= 128:
            raise RunRefused("this needs the run's run_token (the string POST /runs returned)")
        with database():
            run = self._store().run_for_token(run_token)
        if run is None or run.run_id != run_id:
            raise RunRefused(f"that run_token is not the token of {run_id[:60]!r}")
        return run

    def finish_run(self, run_id: str, run_token: Any) -> dict[str, Any]:
        """Finish a run: its open attempts end at the floor, its aggregates are published; finishing again changes
        nothing (a finished run is immutable) and answers the same entry."""
        run = self._own_run(run_id, run_token)
        if run.finished_at is None:
            self._publish(run)
        return self.run_entry(run_id)

    def withdraw_run(self, run_id: str, run_token: Any) -> dict[str, Any]:
        """Mark a run withdrawn: it stays listed (unranked, marked), with whatever it published."""
        run = self._own_run(run_id, run_token)
        with database():
            self._store().withdraw_run(run.run_id)
        self._changed()
        log.info("%s withdrawn by its submitter", run.run_id)
        return self.run_entry(run_id)

    def _publish(self, run: RunInfo) -> None:
        store = self._store()
        current = {f.id: f.family_version for f in families()}
        with database():
            attempts = store.attempts(run.run_id)
            published = publish(run, attempts, current, LEVELS, dither_for(self.secret, run.run_id))
            if store.finish_run(run.run_id, published, FLOOR):
                log.info("%s finished: overall %.2f published", run.run_id, published["overall"]["mean"])
        self._changed()

    # --- reading -------------------------------------------------------------------------------

    def leaderboard(self) -> dict[str, Any]:
        """The leaderboard: cached, and recomputed by one thread at a time when a write on this server (or the
        ``BOARD_TTL_S`` age, for other replicas' writes) made it stale.

        Why: it reads every attempt of every run (some 70,000 rows for 100 complete runs, about two seconds).
        Each board remembers the write count it was read at, so a write during a recompute leaves it stale; and
        concurrent readers wait for the one recompute instead of each starting their own.
        """
        asked = time.monotonic()
        with self.board_lock:
            if self._fresh(asked):
                return copy.deepcopy(self.board[2])  # type: ignore[index]
        with self.compute_lock:
            with self.board_lock:
                if self._fresh(asked):  # another reader recomputed while this one waited
                    return copy.deepcopy(self.board[2])  # type: ignore[index]
                writes, started = self.writes, time.monotonic()
            store = self._store()
            with database():
                runs, attempts = store.runs(), store.attempts()
            current = {f.id: f.family_version for f in families()}
            standard = min(self.settings.standard_set, self.settings.test_instances)
            board = leaderboard(runs, attempts, current, LEVELS, self.fingerprint, BENCHMARK_VERSION, standard,
                                self.public_fingerprints)  # fmt: skip
            board.update(salt_fingerprint=self.fingerprint, benchmark_version=BENCHMARK_VERSION,
                         salt="random (not comparable)" if self.salt_is_random else
                         "public (runs unranked)" if self.salt_is_public else "fixed")  # fmt: skip
            with self.board_lock:
                self.board = (started, writes, board)
            return copy.deepcopy(board)

    def _fresh(self, asked: float) -> bool:
        """Whether the cached board reflects every write on this server and is recent enough. Holds board_lock."""
        if self.board is None:
            return False
        started, writes, _ = self.board
        return writes == self.writes and asked - started < BOARD_TTL_S

    def _changed(self) -> None:
        """A write on this server: a board read before it is stale."""
        with self.board_lock:
            self.writes += 1

    def run_entry(self, run_id: str) -> dict[str, Any]:
        board = self.leaderboard()
        for entry in board["runs"]:
            if entry["run_id"] == run_id:
                return entry
        raise UnknownRun(f"unknown run_id {run_id[:60]!r}")

    def check_salt(self) -> None:
        """Refuse (``WeakSalt``) a fixed salt under ``MIN_SALT_BITS`` that is not declared public.

        Why refuse rather than warn: the salt's fingerprint is public, so a guessable salt is found offline (an
        8-character one fell to a 1,111-word dictionary in 0.023 s), and then every test instance's truth is too, and
        a counted run scores 0.99; a warning in a log nobody reads let such a server run."""
        if self.salt_is_random:
            return
        if self.salt_is_public:
            log.warning("the test salt is public (MECHSANDBOX_PUBLIC_SALT or a published salt): anyone can derive the "
                        "test split, so runs here are listed unranked")  # fmt: skip
            return
        bits = salt_bits(self.settings.test_salt)
        if bits < MIN_SALT_BITS:
            raise WeakSalt(f"MECHSANDBOX_TEST_SALT is guessable: about {bits:.0f} bits (length x log2 of its "
                           f"characters' alphabets), under {MIN_SALT_BITS}; use a random one (python -c 'import "
                           "secrets; print(secrets.token_urlsafe(32))'), or declare it public with "
                           "MECHSANDBOX_PUBLIC_SALT=true (its runs are then unranked)")  # fmt: skip


class UnknownRun(EpisodeError):
    status = 404
