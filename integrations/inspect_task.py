"""MechSandbox as an Inspect task (issue 18): ``inspect eval mechsandbox/mechsandbox --model <model>``.

Each sample is one episode, (family, level, split, seed or index). A setup solver opens an OpenEnv session on a
MechSandbox server and starts the episode with the ``start_episode`` tool; the solver is Inspect's ``react`` agent
with ``run_python`` and ``describe_task`` as tools and ``submit_answer`` as its submit tool; the scorer is the
episode's own graded score (the protocol's floor when the budget ran out or nothing was graded); the session is
closed when the sample ends. Everything goes over POST /mcp (server/mcp.py), the same four tools with the same
JSON schemas (server/tools.py), so the budget, the one graded submission and train-only truth are the server's
rules, not this module's, and a remote leaderboard server is driven exactly like a local one.

The server: the task's ``url`` argument, else ``$MECHSANDBOX_URL``, else a local ``mechsandbox serve`` started on
a free port for the life of the process.

Offline model: ``--model mechsandbox-reference/scripted`` plays each family's reference snippets through the tools
(the scripted baseline as an Inspect model API), so the whole pipeline runs without a model provider or network.
Inspect's own ``mockllm/model`` runs it too once tiktoken's ``o200k_base`` encoding is at hand (Inspect counts its
tokens with it and downloads it on first use); it never calls a tool, so every sample ends at the message limit
with the floor score.

An episode the infrastructure lost (the server, its sandbox or database, a full or draining server, a server that
stopped answering) is not scored: the tool call, or the setup, raises ``protocol.InfrastructureError`` naming the
side, which Inspect records as the sample's error, so it is in no metric; ``inspect eval --retry-on-error N`` plays
such a sample again. On the test split a sample lost after its episode had started is then a replay the server does
not count (a run gets no second try): only one lost before its first observation is safely retried.

Why not Inspect's MCP tool source (``mcp_server_http``): it speaks the streamable-HTTP transport and keeps one
MCP session per server, while an episode is an OpenEnv session of its own; four plain tools over JSON-RPC keep one
session per sample and need no extra transport.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import anyio
from inspect_ai import Task, task
from inspect_ai.agent import AgentState, AgentSubmit, react
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    ChatMessageUser,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    modelapi,
)
from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import ToolChoice, ToolDef, ToolError, ToolInfo, ToolParams
from inspect_ai.util import store

from ..protocol import FLOOR, InfrastructureError
from .mcp_client import (
    INSTRUCTIONS,
    McpError,
    capacity_delays,
    rpc,
    server_url,
    split_names,
    tool_text,
    wait_for_capacity,
)
from .mcp_infra import infrastructure_error, refused_by_infrastructure

CAPACITY_WAIT_S = 300.0  # how long a sample waits for a session when the server is at its session cap
SESSION_KEY, URL_KEY, STATE_KEY = "mechsandbox:session_id", "mechsandbox:url", "mechsandbox:state"
TASK_KEY = "mechsandbox:task_id"  # the sample's family (for the offline reference model)
SUBMITTED_KEY = "mechsandbox:submitted"  # the last submit_answer arguments, as JSON (the score's ``answer``)
RPC_TIMEOUT_S = 600.0  # a run_python step is bounded by the sandbox's own timeout; this only guards a dead server


async def open_session(url: str) -> str:
    """A new OpenEnv session; at the server's session cap, wait (with backoff) for another sample to close one."""
    delays = capacity_delays(CAPACITY_WAIT_S)
    while True:
        try:
            return (await rpc(url, "openenv/session/create", {}, RPC_TIMEOUT_S))["session_id"]
        except McpError as exc:
            failure = infrastructure_error(exc, started=False)
            if failure is not None:
                raise failure from None
            try:
                delay = wait_for_capacity(exc, delays)
            except McpError:
                if exc.at_capacity:  # full for the whole wait: the server's side, and nothing was started
                    raise InfrastructureError("capacity", f"{exc} after waiting {CAPACITY_WAIT_S:g} s") from None
                raise
        await anyio.sleep(delay)


async def call_tool(name: str, arguments: dict[str, Any]) -> str:
    """Call one episode tool for this sample's session; a refusal becomes Inspect's ``ToolError`` (the model sees
    it and may try again), and the episode's state (step, done, score) is kept in the sample's store. A failure of
    the infrastructure raises ``InfrastructureError``: the sample's error, never a score."""
    url, session_id = store().get(URL_KEY), store().get(SESSION_KEY)
    if session_id is None:
        raise McpError("no MechSandbox session: add start_episode() to the task's setup")
    started = name != "start_episode"
    try:
        result = await rpc(url, "tools/call", {"name": name, "arguments": arguments, "session_id": session_id},
                           RPC_TIMEOUT_S)  # fmt: skip
    except McpError as exc:
        failure = infrastructure_error(exc, started)
        if failure is not None:
            raise failure from None
        raise
    text = tool_text(result)
    if result.get("isError"):
        side = refused_by_infrastructure(name, text)
        if side is not None:  # the server's side refused the call (as a tool error, from a server before JSON-RPC's)
            raise InfrastructureError(side, text.partition(": ")[2], started=started)
        raise ToolError(text)
    if result.get("structuredContent"):
        store().set(STATE_KEY, result["structuredContent"])
    if name == "submit_answer":
        if not (result.get("structuredContent") or {}).get("done"):
            # an answer that does not fit the schema costs a step and is not graded: to react, a submit tool that
            # returns is the final answer, so this one must be an error for the agent to go on
            raise ToolError(text)
        store().set(SUBMITTED_KEY, json.dumps(arguments, default=str))
    return text


def episode_tool(name: str) -> ToolDef:
    """One of server/tools.py's tools as an Inspect tool, with the server's own description and JSON schema."""
    from ..server.tools import EpisodeTools  # here: Inspect imports this module for every run, and this pulls torch

    spec = next(s for s in EpisodeTools.specs() if s["name"] == name)

    async def execute(**arguments: Any) -> str:
        return await call_tool(name, arguments)

    # parallel=False: one episode's calls are sequential (the server runs them in order on the session's thread)
    return ToolDef(execute, name=name, description=spec["description"],
                   parameters=ToolParams.model_validate(spec["inputSchema"]), parallel=False)  # fmt: skip


# -- the task ------------------------------------------------------------------------------------------------------
Names = str | Sequence[str]  # comma-separated, or a list (``-T tasks=a,b`` on the CLI; a list from Python)


def episodes(
    tasks: Names, levels: Names, split: str, instances: int, first: int, run_token: str | None
) -> MemoryDataset:
    """One sample per (family, level, n): train samples name a seed (``first + n``), test samples an index."""
    from ..tasks import LEVELS, get_family

    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, not {split!r}")
    bad = [level for level in split_names(levels) if level not in LEVELS]
    if bad:
        raise ValueError(f"unknown level {bad[0]!r}; the levels are {', '.join(LEVELS)}")
    samples = []
    families = dict.fromkeys(get_family(f).id for f in split_names(tasks))  # aliases resolved, duplicates dropped
    for task_id in families:  # an unknown name failed above, before any episode
        for level in dict.fromkeys(split_names(levels)):
            for n in range(first, first + instances):
                where = {"seed": n} if split == "train" else {"index": n}
                start = {"task_id": task_id, "level": level, "split": split, **where}
                if run_token is not None and split == "test":
                    start["run_token"] = run_token
                meta = {"family": task_id, "level": level, "split": split, "start_episode": start}
                samples.append(Sample(id=f"{task_id}/{level}/{split}/{n}", input=f"MechSandbox episode {start}",
                                      metadata=meta))  # fmt: skip
    return MemoryDataset(samples, name="mechsandbox")


@solver
def start_episode(url: str | None = None) -> Solver:
    """Open an OpenEnv session for the sample and start its episode; the task's text becomes the user message."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        if state.epoch > 1 and "run_token" in state.metadata["start_episode"]:
            # a run counts each test instance's first episode; a second epoch would replay it as an uncounted one
            raise ValueError("a run_token eval counts each test instance once: run it with one epoch")
        where = await anyio.to_thread.run_sync(server_url, url)  # a local server start polls for up to 2 minutes
        session_id = await open_session(where)
        store().set(URL_KEY, where)
        store().set(SESSION_KEY, session_id)
        store().set(TASK_KEY, state.metadata["family"])
        text = await call_tool("start_episode", state.metadata["start_episode"])
        state.messages = [ChatMessageUser(content=text)]
        return state

    return solve


async def _close_session(state: TaskState) -> None:
    session_id = state.store.get(SESSION_KEY)
    if session_id is not None:
        with contextlib.suppress(McpError):  # reaped, or the server went away (ServerUnavailable): nothing is left open
            await rpc(state.store.get(URL_KEY), "openenv/session/close", {"session_id": session_id}, RPC_TIMEOUT_S)


async def _until_episode_ends(state: AgentState) -> bool:
    """react's continue hook: stop once the server says the episode is over (graded, or the budget ran out)."""
    return not (store().get(STATE_KEY) or {}).get("done")


@scorer(metrics=[mean(), stderr()])
def episode_score() -> Scorer:
    """The episode's graded score as the server computed it; the floor when no answer was graded."""

    async def score(state: TaskState, target: Target) -> Score:
        # from the state the server sent with the last tool call (an episode only ends through one), so a saved
        # log can be re-scored (`inspect score`) without the server or the session
        final = state.store.get(STATE_KEY) or {}
        graded = final.get("done") and final.get("score") is not None
        value = float(final["score"]) if graded else FLOOR
        if final.get("sealed"):  # a counted attempt on a fixed salt: its score is the run's published result's
            how = "sealed: this counted attempt's score shows only in its run's published result (the floor here)"
        elif not graded:
            how = "no answer was graded"
        elif final.get("truncated"):
            how = "the step budget ran out"
        else:
            how = "graded"
        shown = {k: final.get(k) for k in ("task_id", "level", "split", "step", "max_steps", "sealed")}
        return Score(value=value, answer=state.store.get(SUBMITTED_KEY), explanation=how, metadata=shown)

    return score


@task
def mechsandbox(
    tasks: Names = "dead-neurons",
    levels: Names = "easy",
    split: str = "train",
    instances: int = 1,
    first: int = 0,
    url: str | None = None,
    run_token: str | None = None,
    message_limit: int = 80,
) -> Task:
    """MechSandbox episodes, scored by the server's graders.

    Args:
        tasks: family ids (comma-separated or a list; ``mechsandbox tasks`` lists them).
        levels: easy, medium, hard (comma-separated or a list).
        split: train (seeds ``first``..) or test (held-out indices ``first``..).
        instances: samples per (family, level).
        first: the first seed (train) or index (test).
        url: the server (default ``$MECHSANDBOX_URL``, else a local server started for the eval).
        run_token: a test-split run's token from POST /runs, so the episodes count for the leaderboard.
        message_limit: the conversation's length limit (the server's step budget ends an episode first).
    """
    return Task(
        dataset=episodes(tasks, levels, split, instances, first, run_token),
        setup=start_episode(url),
        solver=react(
            prompt=INSTRUCTIONS,
            tools=[episode_tool("run_python"), episode_tool("describe_task")],
            submit=AgentSubmit(name="submit_answer", tool=episode_tool("submit_answer"), answer_only=True,
                               keep_in_messages=True),  # a refused submission stays visible in the log
            on_continue=_until_episode_ends,
        ),
        scorer=episode_score(),
        cleanup=_close_session,
        message_limit=message_limit,
    )


# -- an offline model: the scripted baseline as an Inspect model API ---------------------------------------------


@modelapi(name="mechsandbox-reference")
class ReferenceModel(ModelAPI):
    """Plays the family's reference snippets (``tasks/<family>/reference.py``, public code without any truth) with
    ``run_python``, then ``submit_answer(variable="answer")``: the scripted baseline, for offline runs and tests.
    It reads the sample's family from the sample's store (set by start_episode) and counts the tool results so
    far."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig | None = None, **model_args: Any) -> None:  # fmt: skip
        super().__init__(model_name, base_url, api_key, [], config or GenerateConfig())

    async def generate(
        self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
    ) -> ModelOutput:
        from ..tasks import get_family

        task_id = store().get(TASK_KEY)
        if task_id is None:
            return self._output(ModelOutput.from_content(self.model_name, "No MechSandbox episode was started."))
        snippets = get_family(task_id).reference
        ran = sum(isinstance(m, ChatMessageTool) and m.function == "run_python" for m in input)
        if ran < len(snippets):
            call = ("run_python", {"code": snippets[ran]})
        else:
            call = ("submit_answer", {"variable": "answer"})
        return self._output(ModelOutput.for_tool_call(self.model_name, call[0], call[1]))

    @staticmethod
    def _output(output: ModelOutput) -> ModelOutput:
        # explicit usage: Inspect would otherwise count tokens with tiktoken, which downloads its encoding
        size = len(json.dumps(output.message.model_dump(exclude_none=True), default=str))
        output.usage = ModelUsage(input_tokens=0, output_tokens=size, total_tokens=size)
        return output
