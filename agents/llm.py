"""The LLM agent: an OpenAI-compatible chat model writes snippets and, once, the answer.

Protocol taught by the system prompt: code goes in a fenced ```python block (one per reply); the
answer ends the episode with ``FINAL_ANSWER: <json>`` (or a JSON action object); a hypothesis can be
kept with ``CANDIDATE: <json>``, which is what the harness submits if time runs out. A reply that is
none of these costs a turn with a clear error and is never turned into a guessed submission.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from ..protocol import ACTION_FIELDS
from .base import Agent, Turn

PROMPT_VERSION = "mechsandbox-llm-v3"  # v2: submitting a sandbox variable (solution_from); v3: CPU-time limit
OUTPUT_SHOWN = 3000
HISTORY_KEEP = 14

SYSTEM = """You are a mechanistic-interpretability researcher working in a Python sandbox.
Each episode gives you a small PyTorch model with a planted mechanism; find it and submit one answer.

The sandbox (a notebook: variables persist between your snippets):
- Names: `model` (the public model), the task's probe inputs (see the task text), `torch`, `nn`, `F`,
  `np`, `math`, `json`; transformer tasks also have `utils` (TransformerLens-style: `utils.get_act_name`).
  Importable: torch (nn, nn.functional, fft, linalg, special, autograd, optim), numpy (linalg, fft,
  random), math, itertools, collections, functools, statistics, heapq, json, random, re, copy, einops
  (rearrange, reduce, repeat, einsum, pack, unpack, parse_shape), transformer_lens (utils only).
- Transformer models follow TransformerLens: `model(tokens)`, `model.run_with_cache(tokens)`,
  `cache["pattern", layer]`, `model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])` with hook names
  like `blocks.0.attn.hook_z`, `with model.hooks(fwd_hooks=[(name, fn)]):`, `model.reset_hooks()`, weights
  `model.W_Q`, `model.W_O`, `model.cfg`, factored circuits `model.OV` / `model.QK` (`.AB`, `.svd()`,
  `.eigenvalues`, `[layer, head]`), cache helpers (`decompose_resid`, `stack_head_results`, `logit_attrs`),
  strings (`model.to_str_tokens`, `to_string`, `to_tokens`, `tokenizer.decode`: token i is "t{i}").
  `reset_model()` undoes weight edits and hooks (other names are kept). Weights load with
  `requires_grad=False`: call `model.requires_grad_(True)` for weight gradients, or `x.requires_grad_()`
  on an activation inside a hook for attribution patching.
- Refused: files, pickle, os/sys/subprocess, names starting with `_`, TorchScript, raw memory,
  global settings. Output is capped at 64 KiB. Each snippet may use 10 s of CPU time: only its own computation
  counts, so a busy server makes it slower, never shorter. A snippet that runs past it is stopped with a TimeoutError
  (variables kept); one that ignores the stop loses its variables.
- Use `print` to see results; a bare expression on a snippet's last line shows its value, as in a notebook.
  Keep snippets short and purposeful.

How to reply (exactly one of these per reply):
1. A code snippet in one fenced block:
```python
print(model.cfg)
```
2. Your final answer, graded ONCE and ending the episode, on its own line:
FINAL_ANSWER: <json matching the answer schema>
3. An answer too large to type (e.g. a basis of vectors) built in the sandbox as a variable, submitted by
name with a reply that is exactly the JSON {"solution_from": "basis"} (graded ONCE, like FINAL_ANSWER).
You may also keep your current best guess on a line `CANDIDATE: <json>`; if you run out of steps or time,
the candidate is submitted. There is exactly one graded submission and no feedback before it.
"""


def build_task_message(obs: dict[str, Any]) -> str:
    return (
        f"Task `{obs['task_id']}` (level {obs['level']}), {obs['max_steps']} steps in total.\n\n"
        f"{obs['prompt']}\n\nAnswer schema (JSON schema): {json.dumps(obs['answer_schema'])}\n"
        f"Example of a well-formed answer: {json.dumps(obs['answer_example'])}\n"
        "Start by exploring the model with a snippet."
    )


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_JSON_FENCE = re.compile(r"```json[ \t]*\n(.*?)```", re.S)
_MARKER = re.compile(r"^\s*(FINAL_ANSWER|CANDIDATE)\s*:\s*(.+)$", re.M)


def _json_after(text: str) -> Any:
    """Parse the JSON value at the start of ``text`` (the rest of the line, or more if it spans lines)."""
    decoder = json.JSONDecoder()
    value, _ = decoder.raw_decode(text.strip())
    return value


def parse_reply(reply: str) -> tuple[Turn, Any]:
    """(turn, candidate): what to do with a model reply, and any CANDIDATE it states."""
    candidate = None
    final = None
    for match in _MARKER.finditer(reply):
        start = match.start(2)
        try:
            value = _json_after(reply[start:])
        except ValueError:
            if match.group(1) == "FINAL_ANSWER":
                return Turn(error="FINAL_ANSWER must be followed by valid JSON"), None
            continue
        if match.group(1) == "FINAL_ANSWER":
            final = value
        else:
            candidate = value
    if final is not None:
        return Turn({"solution_target": final}), candidate
    for block in [*_JSON_FENCE.findall(reply), reply.strip()]:
        try:
            obj = json.loads(block)
        except ValueError:
            continue
        if isinstance(obj, dict) and sum(k in obj for k in ACTION_FIELDS) == 1 and set(obj) <= set(ACTION_FIELDS):
            return Turn({k: obj[k] for k in ACTION_FIELDS if k in obj}), candidate
    code = _FENCE.findall(reply)
    if code and code[0].strip():
        return Turn({"python_code": code[0].strip()}), candidate
    return Turn(error="the reply had no ```python block, no FINAL_ANSWER line and no JSON action"), candidate


class LLMAgent(Agent):
    name = "llm"

    def __init__(self, client: Any, model: str, temperature: float = 0.2, max_tokens: int = 1200,
                 call_timeout: float = 90.0):  # fmt: skip
        self.client, self.model = client, model
        self.temperature, self.max_tokens, self.call_timeout = temperature, max_tokens, call_timeout
        self.calls = 0
        self.failures = 0
        self.deadline: float | None = None

    def describe(self) -> dict[str, Any]:
        return {"agent": self.name, "model": self.model, "temperature": self.temperature,
                "prompt_version": PROMPT_VERSION}  # fmt: skip

    def begin(self, obs: dict[str, Any]) -> None:
        super().begin(obs)
        self.messages: list[dict[str, str]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": build_task_message(obs)},
        ]
        self.candidate: Any = None
        self.pending_feedback: str | None = None

    def complete(self, messages: list[dict[str, str]]) -> str:
        """One chat completion (counted); raises on failure."""
        self.calls += 1
        timeout = self.call_timeout
        if self.deadline is not None:
            timeout = max(5.0, min(timeout, self.deadline - time.monotonic()))
        response = self.client.chat.completions.create(
            model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens,
            timeout=timeout,
        )  # fmt: skip
        return response.choices[0].message.content or ""

    def _context(self) -> list[dict[str, str]]:
        head, tail = self.messages[:2], self.messages[2:]
        return head + tail[-HISTORY_KEEP:]

    def next_turn(self, obs: dict[str, Any]) -> Turn:
        appended = len(self.messages) > 2 or self.pending_feedback is not None
        if appended:
            self.messages.append({"role": "user", "content": self.pending_feedback or self._feedback(obs)})
        try:
            reply = self.complete(self._context())
        except Exception as exc:
            self.failures += 1
            if appended:
                self.messages.pop()  # the same context is retried next turn
            return Turn(error=f"LLM call failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        self.pending_feedback = None
        self.messages.append({"role": "assistant", "content": reply})
        turn, candidate = parse_reply(reply)
        if candidate is not None:
            self.candidate = candidate
        if turn.action is None:
            self.pending_feedback = (
                f"Your reply could not be used: {turn.error}. Reply with one ```python block or FINAL_ANSWER."
            )
        return turn

    @staticmethod
    def _feedback(obs: dict[str, Any]) -> str:
        text = obs.get("stdout_or_error") or ""
        if len(text) > OUTPUT_SHOWN:
            text = text[:OUTPUT_SHOWN] + f"\n... [{len(text) - OUTPUT_SHOWN} more characters]"
        left = obs.get("max_steps", 0) - obs.get("step", 0)
        return f"Output (step {obs.get('step')}, {left} steps left):\n{text or '(no output)'}"

    def fallback_answer(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self.candidate is not None:
            return {"solution_target": self.candidate}
        return super().fallback_answer(obs)


DEFAULT_API_BASE_URL = "https://router.huggingface.co/v1"
DEFAULT_MODEL = "Qwen/Qwen2.5-72B-Instruct"


def client_from_env(environ: dict[str, str] | None = None) -> tuple[Any, str, str | None]:
    """(OpenAI client, model name, error): ``API_BASE_URL``, ``MODEL_NAME``, ``API_KEY`` (wins) or ``HF_TOKEN``.

    A missing key is reported as an error string, and the client is still built (with a placeholder
    key) so that callers make their LLM call and fail visibly rather than silently skip it.
    """
    import os

    from openai import OpenAI

    env = os.environ if environ is None else environ
    key = env.get("API_KEY") or env.get("HF_TOKEN")
    error = None if key else "no API key: set HF_TOKEN (or API_KEY) for the LLM endpoint"
    client = OpenAI(base_url=env.get("API_BASE_URL") or DEFAULT_API_BASE_URL, api_key=key or "missing-api-key",
                    max_retries=1)  # fmt: skip
    return client, env.get("MODEL_NAME") or DEFAULT_MODEL, error
