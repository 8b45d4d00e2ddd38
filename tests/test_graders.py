"""Graders: exact, partial, superset (2x, 4x), all-components, empty, malformed, alternative and
rejected answer shapes, for every family; plus property tests over arbitrary JSON values."""

from __future__ import annotations

import json
import math

import pytest
from helpers import FAMILY_IDS, HEAD_FAMILIES, SET_FAMILIES, cached_instance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.grading import clamp, jaccard, parse_heads


def truth_items(task_id: str, truth: dict) -> list:
    if task_id in HEAD_FAMILIES:
        return [list(h) for h in truth["heads"]]
    if "frequencies" in truth:
        return list(truth["frequencies"])
    return list(truth["indices"])


def universe(task_id: str, truth: dict) -> list:
    if task_id in HEAD_FAMILIES:
        return [[lay, h] for lay in range(truth["n_layers"]) for h in range(truth["n_heads"])]
    if "frequencies" in truth:
        return list(range(1, (truth["p"] - 1) // 2 + 1))
    return list(range(truth["n"]))


def wrong_items(task_id: str, truth: dict, k: int) -> list:
    items = truth_items(task_id, truth)
    return [u for u in universe(task_id, truth) if u not in items][:k]


@pytest.fixture(params=[(t, lvl) for t in SET_FAMILIES for lvl in LEVELS], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request):
    task_id, level = request.param
    return task_id, cached_instance(task_id, 5, level).truth


def test_exact_answer_scores_099(case) -> None:
    task_id, truth = case
    g = grade(task_id, truth_items(task_id, truth), truth)
    assert (g.score, g.rejected) == (0.99, False)


def test_universe_is_at_least_4x_the_truth(case) -> None:
    task_id, truth = case
    assert len(universe(task_id, truth)) >= 4 * len(truth_items(task_id, truth))


def test_supersets_lose(case) -> None:
    task_id, truth = case
    items = truth_items(task_id, truth)
    k = len(items)
    two = grade(task_id, items + wrong_items(task_id, truth, k), truth)
    four = grade(task_id, items + wrong_items(task_id, truth, 3 * k), truth)
    everything = grade(task_id, universe(task_id, truth), truth)
    assert two.score == pytest.approx(0.5)
    assert four.score == pytest.approx(0.25)
    assert everything.score <= 0.25
    assert everything.score < four.score <= two.score < 0.99


def test_partial_and_empty_and_wrong(case) -> None:
    task_id, truth = case
    items = truth_items(task_id, truth)
    if len(items) > 1:
        part = grade(task_id, items[:1], truth)
        assert part.score == pytest.approx(1 / len(items))
    assert grade(task_id, [], truth).score == 0.01
    assert grade(task_id, wrong_items(task_id, truth, len(items)), truth).score == 0.01


def test_duplicates_are_ignored(case) -> None:
    task_id, truth = case
    items = truth_items(task_id, truth)
    assert grade(task_id, items + items, truth).score == 0.99


def test_out_of_range_is_rejected_not_clamped(case) -> None:
    task_id, truth = case
    bad = [[99, 0]] if task_id in HEAD_FAMILIES else [10_000]
    g = grade(task_id, bad, truth)
    assert g.rejected and "out of range" in g.message


@pytest.mark.parametrize("bad", [None, "three", True, 1.5, {"x": 1}, [[[1]]], float("nan"), [True]])
def test_malformed_answers_are_rejected_with_a_message(case, bad) -> None:
    task_id, truth = case
    g = grade(task_id, bad, truth)
    assert g.rejected
    assert g.score == 0.01
    assert g.message and "\n" not in g.message


def test_index_answer_shapes() -> None:
    truth = cached_instance("dead-neurons", 5, "easy").truth
    items = truth["indices"]
    assert grade("dead-neurons", {"indices": items}, truth).score == 0.99
    assert grade("dead-neurons", [float(i) for i in items], truth).score == 0.99
    single = cached_instance("multiplication-neuron", 5, "easy").truth
    assert grade("multiplication-neuron", single["indices"][0], single).score == 0.99


def test_frequencies_fold_k_and_p_minus_k() -> None:
    truth = cached_instance("fourier-frequencies", 5, "medium").truth
    p = truth["p"]
    mirrored = [p - k for k in truth["frequencies"]]
    assert grade("fourier-frequencies", mirrored, truth).score == 0.99
    assert grade("fourier-frequencies", [0], truth).rejected
    assert grade("fourier-frequencies", [p], truth).rejected


def test_head_answer_shapes() -> None:
    truth = cached_instance("copy-head", 5, "easy").truth
    ((lay, h),) = truth["heads"]
    for ok in ([[lay, h]], [f"L{lay}H{h}"], {f"({lay}, {h})": 1.0}, [(lay, h)], [f"l{lay}h{h}"]):
        assert grade("copy-head", json.loads(json.dumps(ok)), truth).score == 0.99, ok
    for bad in (lay, [lay, h], "head 3", [[lay]]):
        g = grade("copy-head", bad, truth)
        assert g.rejected, bad
    assert "[[0, 2]]" in grade("copy-head", [lay, h], truth).message
    assert "[[0, 2]]" in grade("copy-head", 3, truth).message
    # the earlier project's dict with a zero weight means "not this head"
    assert (
        grade("copy-head", {f"({lay}, {h})": 1.0, "(0, 0)" if (lay, h) != (0, 0) else "(1, 1)": 0.0}, truth).score
        == 0.99
    )


def test_roles_weighted_when_given() -> None:
    truth = cached_instance("induction-circuit", 5, "easy").truth
    heads = truth["heads"]
    roles = truth["roles"]
    swapped = {k: ("induction" if v == "previous-token" else "previous-token") for k, v in roles.items()}
    assert grade("induction-circuit", heads, truth).score == 0.99
    assert grade("induction-circuit", {"heads": heads, "roles": roles}, truth).score == 0.99
    assert grade("induction-circuit", {"heads": heads, "roles": swapped}, truth).score == pytest.approx(0.8)
    half = {k: v for k, v in list(roles.items())[:1]}
    # one of two roles right is chance level for two labels: the role part scores 0
    assert grade("induction-circuit", {"heads": heads, "roles": half}, truth).score == pytest.approx(0.8)
    assert grade("induction-circuit", {"heads": heads, "roles": {"L0H0": "boss"}}, truth).rejected
    assert grade("induction-circuit", {"heads": heads, "extra": 1}, truth).rejected


def test_role_labels_earn_only_as_much_as_the_heads_are_right() -> None:
    """Every head of the model, each labelled by its layer's role, has all true roles right: the role part is
    scaled by the Jaccard, so it adds 0.2 x J, not a flat 0.2 (issue 16: a union of look-alikes farmed it)."""
    truth = cached_instance("induction-circuit", 5, "easy").truth
    n_layers, n_heads = truth["n_layers"], truth["n_heads"]
    layer_role = ("previous-token", "induction")
    every = {f"L{ly}H{h}": layer_role[ly] for ly in range(n_layers) for h in range(n_heads)}
    j = 2 / (n_layers * n_heads)
    assert grade("induction-circuit", every, truth).score == pytest.approx(max(0.01, j))
    first = {k: v for k, v in list(truth["roles"].items())[:1]}  # one true head, rightly labelled: J = 1/2
    assert grade("induction-circuit", {"roles": first}, truth).score == pytest.approx(0.5 * 0.8)  # 1 of 2: chance


def test_roles_alone_imply_heads() -> None:
    truth = cached_instance("committee-circuit", 5, "easy").truth
    assert grade("committee-circuit", {"roles": truth["roles"]}, truth).score == 0.99


def test_primitives() -> None:
    assert jaccard(set(), set()) == 1.0
    assert jaccard({1, 2}, {2, 3}) == pytest.approx(1 / 3)
    assert clamp(math.nan) == 0.01 and clamp(5) == 0.99 and clamp(-1) == 0.01
    assert parse_heads(["L1H2", [0, 3]], 2, 4) == {(1, 2), (0, 3)}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


@pytest.mark.parametrize("task_id", FAMILY_IDS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=json_values)
def test_any_json_value_gives_a_score_or_a_clear_rejection(task_id: str, answer) -> None:
    truth = cached_instance(task_id, 5, "medium").truth
    g = get_family(task_id).grade(answer, truth)
    assert 0.01 <= g.score <= 0.99
    assert isinstance(g.message, str)
    if g.rejected:
        assert g.message and "\n" not in g.message and len(g.message) < 300
