"""Train and test instances: who chooses the seed, and how a test seed stays secret.

``train``: the client chooses the seed (< 2**31) and level. ``test``: the client chooses a task,
level and index k; the server derives the seed from HMAC-SHA256(salt, "test/{family}/{level}/{k}")
(the first 8 bytes that are not below 2**31, so test seeds never collide with train seeds) and
addresses the instance by an opaque HMAC-derived id. The seed of a test instance never leaves the
server, so a test instance cannot be regenerated offline to read its truth.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

TRAIN_SEED_LIMIT = 2**31
SPLITS = ("train", "test")


@dataclass(frozen=True)
class InstanceRef:
    """Where an episode's instance comes from (the seed stays in the server)."""

    task_id: str
    level: str
    split: str
    seed: int
    instance_id: str
    index: int | None = None


def heldout_seed(salt: bytes, task_id: str, level: str, index: int) -> int:
    digest = hmac.new(salt, f"test/{task_id}/{level}/{index}".encode(), hashlib.sha256).digest()
    for start in range(0, len(digest) - 7, 8):
        seed = int.from_bytes(digest[start : start + 8], "big")
        if seed >= TRAIN_SEED_LIMIT:
            return seed
    return TRAIN_SEED_LIMIT + index  # 2**-132 chance: every 8-byte window below 2**31


def heldout_instance_id(salt: bytes, task_id: str, level: str, index: int) -> str:
    digest = hmac.new(salt, f"instance/{task_id}/{level}/{index}".encode(), hashlib.sha256).hexdigest()
    return f"test-{digest[:20]}"


def train_ref(task_id: str, level: str, seed: int) -> InstanceRef:
    return InstanceRef(task_id, level, "train", seed, f"train-{task_id}-{level}-{seed}")


def heldout_ref(salt: bytes, task_id: str, level: str, index: int) -> InstanceRef:
    return InstanceRef(
        task_id,
        level,
        "test",
        heldout_seed(salt, task_id, level, index),
        heldout_instance_id(salt, task_id, level, index),
        index,
    )


def practice_ref(salt: bytes, task_id: str, level: str, index: int) -> InstanceRef:
    """A practice instance: a run-less test reset on a fixed-salt server (``MECHSANDBOX_PRACTICE``). Its own derivation
    (HMAC over ``practice/...``), so practice never plays a counted instance: studying it with fresh step budgets
    teaches nothing about the standard set's answers (issue 55), and its ids (``practice-...``) are its own."""
    digest = hmac.new(salt, f"practice/{task_id}/{level}/{index}".encode(), hashlib.sha256).digest()
    seed = TRAIN_SEED_LIMIT + int.from_bytes(digest[:8], "big") % (2**63 - TRAIN_SEED_LIMIT)
    name = hmac.new(salt, f"practice-instance/{task_id}/{level}/{index}".encode(), hashlib.sha256).hexdigest()
    return InstanceRef(task_id, level, "test", seed, f"practice-{name[:20]}", index)


def salt_fingerprint(salt: bytes) -> str:
    """A short public name for a salt (12 hex digits): two servers with the same fingerprint serve the same test set.

    It is an HMAC under the salt, so it says nothing about the salt that the public ``instance_id``s do not already
    say; a salt that can be guessed is weak for those too (the server warns about short salts at start-up).
    """
    return hmac.new(salt, b"mechsandbox/salt-fingerprint", hashlib.sha256).hexdigest()[:12]
