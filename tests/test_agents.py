"""Agent units: the LLM reply protocol and the random baseline's answers (always well-formed)."""

from __future__ import annotations

import pytest
from helpers import FAMILY_IDS, cached_instance
from mechsandbox.agents import RandomAgent
from mechsandbox.agents.llm import parse_reply
from mechsandbox.answer_kind import AnswerKind
from mechsandbox.tasks import LEVELS, get_family


@pytest.mark.parametrize(
    ("reply", "action", "candidate"),
    [
        ("Let me look.\n```python\nprint(model)\n```", {"python_code": "print(model)"}, None),
        ("```\nx = 1\nprint(x)\n```", {"python_code": "x = 1\nprint(x)"}, None),
        ("Done.\nFINAL_ANSWER: [3, 7]", {"solution_target": [3, 7]}, None),
        (
            'FINAL_ANSWER: {"heads": [[0, 1]], "roles": {"L0H1": "induction"}}',
            {"solution_target": {"heads": [[0, 1]], "roles": {"L0H1": "induction"}}},
            None,
        ),
        ('```json\n{"solution_from": "answer"}\n```', {"solution_from": "answer"}, None),
        ('{"python_code": "print(1)"}', {"python_code": "print(1)"}, None),
        ("CANDIDATE: [1, 2]\n```python\nprint(2)\n```", {"python_code": "print(2)"}, [1, 2]),
        ("```python\nprint(1)\n```\nFINAL_ANSWER: [5]", {"solution_target": [5]}, None),
    ],
)
def test_usable_replies(reply: str, action: dict, candidate: object) -> None:
    turn, cand = parse_reply(reply)
    assert turn.action == action and turn.error is None and cand == candidate


@pytest.mark.parametrize(
    "reply",
    [
        "I think the answer is 3 and 7.",
        "FINAL_ANSWER: three and seven",
        '{"python_code": "1", "solution_target": [1]}',
        "",
    ],
)
def test_unusable_replies_are_errors_never_guesses(reply: str) -> None:
    turn, _ = parse_reply(reply)
    assert turn.action is None and turn.error


@pytest.mark.parametrize("task_id", FAMILY_IDS)
def test_random_answers_are_always_well_formed(task_id: str) -> None:
    fam = get_family(task_id)
    agent = RandomAgent(seed=1)
    for level in LEVELS:
        inst = cached_instance(task_id, 0, level)
        for _ in range(25):
            answer = agent.random_answer(inst.answer_schema)
            grade = fam.grade(answer, inst.truth, inst)
            assert not grade.rejected, (answer, grade.message)
            if AnswerKind(inst.answer_schema["x-kind"]).is_set:
                size = len(answer["heads"]) if isinstance(answer, dict) else len(answer)
                assert 1 <= size <= min(inst.answer_schema["x-universe"], 2 * inst.answer_schema["x-k-max"])


def test_random_draws_depend_on_the_instance_not_on_the_order_of_episodes() -> None:
    """A concurrent evaluation hands episodes to workers in whatever order they finish, so the random baseline's
    answer for an instance must not depend on what its agent played before (the calibration runs drifted by it)."""
    schema = cached_instance("copy-head", 0, "easy").answer_schema
    obs = [{"instance_id": f"copy-head/easy/test:{i}", "answer_schema": schema} for i in range(6)]

    def answers(order: list[int]) -> dict[int, object]:
        agent, out = RandomAgent(), {}
        for i in order:
            agent.begin(obs[i])
            out[i] = agent.random_answer(schema)
        return out

    forward, backward = answers(list(range(6))), answers(list(range(5, -1, -1)))
    assert forward == backward
    assert len({str(a) for a in forward.values()}) > 1, "different instances get different draws"


def test_which_failures_are_the_infrastructures_and_which_may_be_played_again() -> None:
    """A transport failure is the connection's side; an agent's own exception is not the infrastructure's. A lost
    train episode may be played again; a test one only when its reset failed (a counted run gets no second try)."""
    from mechsandbox.agents import EpisodeRecord
    from mechsandbox.agents.base import infrastructure_failure, may_retry
    from mechsandbox.protocol import InfrastructureError

    refused = infrastructure_failure(ConnectionRefusedError(111, "Connection refused"), started=False)
    assert refused is not None and refused.side == "connection" and not refused.started
    assert str(refused).startswith("infrastructure error (connection): ConnectionRefusedError")
    named = InfrastructureError("sandbox", "the load failed")
    assert infrastructure_failure(named, started=True) is named and named.started  # the harness knew it had started
    assert infrastructure_failure(ValueError("the agent's own bug"), started=True) is None

    def lost(split: str, started: bool) -> EpisodeRecord:
        return EpisodeRecord("copy-head", "easy", split).lost_to(InfrastructureError("draining", "x", started=started))

    assert lost("train", True).score is None and not lost("train", True).graded
    assert [may_retry(lost(split, started)) for split in ("train", "test") for started in (False, True)] == [
        True, True, True, False]  # fmt: skip
    assert not may_retry(EpisodeRecord("copy-head", "easy", "test"))  # graded: nothing to retry
