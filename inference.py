#!/usr/bin/env python3
"""Baseline LLM agent for MechSandbox: one episode per task, strict [START]/[STEP]/[END] lines on stdout.

Environment variables:
  API_BASE_URL   OpenAI-compatible endpoint (default https://router.huggingface.co/v1)
  MODEL_NAME     model id (default Qwen/Qwen2.5-72B-Instruct)
  API_KEY        key for the endpoint (wins when set), else HF_TOKEN
  ENV_URL        a running MechSandbox server; else LOCAL_IMAGE_NAME / IMAGE_NAME (a Docker image, via
                 OpenEnv's docker support); else a local server started here
  TASKS          comma-separated task ids or aliases, as the server lists them at /tasks (default: every
                 family); LEVEL (easy), SPLIT (train), SEED (0; on the test split, the instance index)
  RUN_NAME       SPLIT=test on a server with a fixed test salt: the run registered there (default: the model's
                 name); its run_token goes into every reset, so the episodes count on the server's leaderboard
  DEADLINE_S     global deadline shared by the tasks (default 1080 = 18 min); MAX_TURNS per task (12)

stdout carries only:
  [START] task=<task_id> env=mechsandbox model=<model>
  [STEP] step=<n> action=<one-line action> reward=<0.00> done=<true|false> error=<msg|null>
  [END] success=<true|false> steps=<n> score=<0.000> rewards=<r1,r2,...>
Everything else goes to stderr. [END] is printed whatever happens; rewards is never empty.

An episode the infrastructure lost (the server, its sandbox or database, a full or draining server, the connection)
is played again where that is safe and nothing of it was printed yet (train: a fresh reset; test: only when the
reset itself failed, so a counted run never gets a second try); one still lost ends with a [STEP] whose error is
"infrastructure error (<side>): ..." and an [END] at the floor (the line's format needs a score), and is counted
in the final stderr line. On a counted run (SPLIT=test on a fixed-salt server) a failed LLM endpoint check stops
everything before the run is registered, with one line on stderr and exit status 1: no counted attempt is spent on
an agent that cannot answer.

Why TASKS is resolved by the server's /tasks: this client then imports neither torch nor the task
families (seconds of start-up, on a machine that never runs a model). Only when no server answers
does it fall back to the installed package's list.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

from mechsandbox.agents import LLMAgent, play_episode
from mechsandbox.agents.base import BACKOFF_S, RETRIES, EpisodeRecord, StepLog, may_retry
from mechsandbox.agents.llm import client_from_env
from mechsandbox.catalogue import fetch_catalogue, local_catalogue, select_tasks
from mechsandbox.client import MechSandboxEnv
from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.protocol import InfrastructureError, clamp, one_line
from mechsandbox.submission import _request as submission_request
from mechsandbox.submission import http_base, register_run, server_scoring

ENV_NAME = "mechsandbox"
SUCCESS_THRESHOLD = 0.5


def log(message: str) -> None:
    print(f"[inference] {message}", file=sys.stderr, flush=True)


def emit_step(step: StepLog) -> None:
    action = json.dumps(step.action, separators=(",", ":"), ensure_ascii=True) if step.action else "none"
    error = one_line(step.error, 300) if step.error else "null"
    print(f"[STEP] step={step.step} action={one_line(action, 400)} reward={clamp(step.reward):.2f} "
          f"done={str(step.done).lower()} error={error}", flush=True)  # fmt: skip


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=os.environ.get("TASKS", "all"))
    ap.add_argument("--level", default=os.environ.get("LEVEL", "easy"))
    ap.add_argument("--split", default=os.environ.get("SPLIT", "train"), choices=["train", "test"])
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "0")))
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("DEADLINE_S", "1080")))
    ap.add_argument("--max-turns", type=int, default=int(os.environ.get("MAX_TURNS", "12")))
    return ap.parse_args()


@contextlib.contextmanager
def environment(stack: contextlib.ExitStack) -> Any:
    """A connected sync client, from ENV_URL, a Docker image, or a local server started here."""
    url = os.environ.get("ENV_URL")
    image = os.environ.get("LOCAL_IMAGE_NAME") or os.environ.get("IMAGE_NAME")
    if url:
        client = MechSandboxEnv(base_url=url, message_timeout_s=300).sync()
    elif image:
        client = MechSandboxEnv.from_docker_image(image).sync()
    else:
        log("no ENV_URL or image given: starting a local MechSandbox server")
        client = MechSandboxEnv(base_url=stack.enter_context(LocalServer()).url, message_timeout_s=300).sync()
    with client:
        yield client


def task_list(spec: str, env: Any) -> list[str]:
    """The family ids that TASKS names, as the connected server lists them at GET /tasks.

    Without a server to ask (the environment is unavailable, or its /tasks cannot be read), the
    installed package's families are used; only that path imports ``mechsandbox.tasks`` (and torch).
    """
    catalogue = None
    if env is not None:
        try:
            catalogue = fetch_catalogue(env.async_client.base_url)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reason = f"{type(exc).__name__}: {one_line(exc, 300)}"
            log(f"could not read the server's task list ({reason}); using the local one")
    return select_tasks(spec, local_catalogue() if catalogue is None else catalogue)


def counted(env: Any, split: str) -> bool:
    """Whether this is a counted run: the test split of a server with a fixed salt (its episodes would go on its
    leaderboard). A server whose facts cannot be read is not: no run can be registered there."""
    if env is None or split != "test":
        return False
    try:
        if server_scoring(env.async_client.base_url)["test_salt"] == "fixed":
            return True
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        log(f"could not read the server's scoring facts: {type(exc).__name__}: {one_line(exc, 300)}")
        return False
    log("the server has a random test salt: its test scores are comparable with no other run")
    return False


def counted_run(env: Any, model: str) -> dict[str, Any] | None:
    """Register a run on a counted server (``counted``) and return it (``run_id``, ``run_token``, ...); None when
    registration fails.

    A failure is logged and play goes on: the server then refuses the resets with its own reason, which ends
    each task with an [END] line as any environment error does.
    """
    base = env.async_client.base_url
    try:
        run = register_run(base, os.environ.get("RUN_NAME") or model, model, "inference.py baseline")
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        log(f"could not register a run: {type(exc).__name__}: {one_line(exc, 300)}")
        return None
    log(f"playing as {run['run_id']} (salt fingerprint {run['salt_fingerprint']})")
    return run


def finish_counted_run(base_url: str, run_id: str, run_token: str) -> dict[str, Any]:
    """``POST /runs/{run_id}/finish``: the run's leaderboard entry with its published aggregates."""
    return submission_request(f"{http_base(base_url)}/runs/{run_id}/finish", {"run_token": run_token})


def finish_run(env: Any, run: dict[str, Any]) -> None:
    """Finish the counted run after the last episode and print its published result on standard error (standard
    output carries only the [START]/[STEP]/[END] lines): its attempts were sealed, so each [END] showed the floor."""
    base = env.async_client.base_url
    try:
        entry = finish_counted_run(base, run["run_id"], run["run_token"])
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        log(f"could not finish {run['run_id']}: {type(exc).__name__}: {one_line(exc, 300)}")
        return
    families = " ".join(f"{task}={cell['mean']:.2f}" for task, cell in sorted((entry.get("families") or {}).items()))
    print(f"[RESULT] run={run['run_id']} overall={entry.get('overall')} ci95={entry.get('ci95')} "
          f"precision={entry.get('precision')} {families}", file=sys.stderr, flush=True)  # fmt: skip


def endpoint_error(agent: LLMAgent) -> str | None:
    """One LLM call up front: proves the endpoint (and the key) before any episode; the failure's line, or None."""
    try:
        agent.complete([{"role": "user", "content": "Reply with the single word: ready"}])
    except Exception as exc:
        return f"LLM endpoint check failed: {type(exc).__name__}: {one_line(exc, 300)}"
    return None


def play(agent: LLMAgent, env: Any, reset: dict[str, Any], max_turns: int, on_step: Any) -> EpisodeRecord:
    """One task's episode; an attempt the infrastructure lost is played again (``may_retry``, with a backoff)
    while nothing of it has been printed, so the task's [STEP] lines stay one episode's."""
    attempt = 0
    while True:
        printed: list[StepLog] = []

        def step(log_: StepLog, sink: list[StepLog] = printed) -> None:
            sink.append(log_)
            on_step(log_)

        record = play_episode(agent, env, reset, deadline=agent.deadline, max_turns=max_turns, on_step=step)
        record.attempts = attempt + 1
        left = agent.deadline is None or time.monotonic() + BACKOFF_S * 2**attempt < agent.deadline
        if printed or attempt >= RETRIES or not may_retry(record) or not left:
            return record
        log(f"{reset['task_id']}: {record.infra_error['message']}; trying again")  # type: ignore[index]
        time.sleep(BACKOFF_S * 2**attempt)
        attempt += 1


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    deadline = started + args.deadline
    client, model, key_error = client_from_env()
    if key_error:
        log(key_error)
    agent = LLMAgent(client, model)

    with contextlib.ExitStack() as stack:
        env = None
        try:
            env = stack.enter_context(environment(stack))
        except Exception as exc:
            env_error = f"environment unavailable: {type(exc).__name__}: {one_line(exc, 200)}"
            log(env_error)
        try:
            tasks = task_list(args.tasks, env)
        except (KeyError, ValueError) as exc:
            log(f"bad --tasks/TASKS: {exc}")
            return 2
        llm_error = endpoint_error(agent)
        is_counted = counted(env, args.split)
        if llm_error and is_counted:
            log(f"{llm_error}: stopping before the counted run is registered (no attempt spent)")
            return 1
        if llm_error:
            log(llm_error)
        run = counted_run(env, model) if is_counted else None
        token = run["run_token"] if run else None
        lost = 0
        for i, task_id in enumerate(tasks):
            print(f"[START] task={task_id} env={ENV_NAME} model={model}", flush=True)
            steps: list[StepLog] = []
            score = 0.01
            try:
                if env is None:
                    raise InfrastructureError("connection", env_error)
                remaining = max(1, len(tasks) - i)
                agent.deadline = time.monotonic() + max(0.0, deadline - time.monotonic()) / remaining
                reset = {"task_id": task_id, "level": args.level, "split": args.split}
                reset.update({"index": args.seed} if args.split == "test" else {"seed": args.seed})
                if token:
                    reset["run_token"] = token

                def on_step(step: StepLog, sink: list[StepLog] = steps) -> None:
                    sink.append(step)
                    emit_step(step)

                record = play(agent, env, reset, args.max_turns, on_step)
                if record.infra_error is not None:  # no score: one closing [STEP] names the failure
                    lost += 1
                    failed = StepLog(len(steps) + 1, None, 0.01, True, record.infra_error["message"])
                    steps.append(failed)
                    emit_step(failed)
                else:
                    score = clamp(record.score)
            except Exception as exc:
                log(f"{task_id}: {type(exc).__name__}: {one_line(exc, 300)}")
                failure = exc if isinstance(exc, InfrastructureError) else None  # play() returns the others lost
                lost += failure is not None
                if not steps:
                    why = one_line(failure, 200) if failure else f"{type(exc).__name__}: {one_line(exc, 200)}"
                    failed = StepLog(1, None, 0.01, True, why)
                    steps.append(failed)
                    emit_step(failed)
            rewards = ",".join(f"{clamp(s.reward):.2f}" for s in steps) or "0.01"
            print(f"[END] success={str(score >= SUCCESS_THRESHOLD).lower()} steps={len(steps)} "
                  f"score={score:.3f} rewards={rewards}", flush=True)  # fmt: skip
        if run is not None and env is not None:
            finish_run(env, run)  # before the last line, which stays the count of infrastructure errors
        log(f"done in {time.monotonic() - started:.0f} s; {agent.calls} LLM calls, {agent.failures} failed; "
            f"{lost} infrastructure error{'s' if lost != 1 else ''}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
