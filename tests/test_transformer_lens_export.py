"""Instance.to_transformer_lens(): a real TransformerLens HookedTransformer (the ``[tl]`` extra, installed with
``dev``) whose logits and every cached activation equal ours within 1e-5 on the instance's probe batch, built from
the public weights only.

Within 1e-5 means ``max |ours - theirs| <= 1e-5 * max(1, max |theirs|)`` per tensor in float32: the two libraries
sum in different orders, and where residual components of size 70 cancel to a small logit, float32's round-off is
about 1e-5 (its spacing at 64 is 8e-6). The same models in float64 agree to 1e-9 absolute, which shows the
computation itself is the same."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import cached_instance
from mechsandbox.arch.tl_export import to_transformer_lens

transformer_lens = pytest.importorskip(
    "transformer_lens", reason="the [tl] extra (part of [dev]) is not installed: pip install -e '.[dev]'"
)

CASES = [("copy-head", "easy"), ("induction-circuit", "hard"), ("committee-circuit", "easy"),
         ("head-roles", "medium"), ("fact-storage", "easy"), ("fact-storage", "hard")]  # fmt: skip


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> None:
    """Equal within ``tol`` of the tensor's scale (at least 1); -inf (the causal mask) in the same places."""
    finite = torch.isfinite(b)
    assert a.shape == b.shape and torch.equal(torch.isfinite(a), finite), what
    worst, scale = float((a - b)[finite].abs().max()), max(1.0, float(b[finite].abs().max()))
    assert worst <= tol * scale, f"{what}: differs by {worst:.3g} at scale {scale:.3g}"


def assert_same_run(model, tl_model, tokens: torch.Tensor, tol: float) -> None:
    tl_model.set_use_attn_result(True)  # so TransformerLens caches hook_result too, as our run_with_cache does
    with torch.no_grad():
        ours_logits, ours = model.run_with_cache(tokens)
        tl_logits, theirs = tl_model.run_with_cache(tokens)
        assert_close(ours_logits, tl_logits, tol, "logits")
        names = list(ours.keys())
        assert len(names) > 10 and set(names) <= set(theirs.keys()), sorted(set(names) - set(theirs.keys()))
        for name in names:
            assert_close(ours[name], theirs[name], tol, name)
        assert_close(model(tokens, return_type="loss"), tl_model(tokens, return_type="loss"), tol, "loss")


@pytest.mark.parametrize(("task_id", "level"), CASES)
def test_the_export_computes_what_ours_computes(task_id: str, level: str) -> None:
    torch.set_num_threads(1)
    inst = cached_instance(task_id, 0, level)
    tl_model = inst.to_transformer_lens()
    assert type(tl_model).__name__ == "HookedTransformer" and type(tl_model).__module__.startswith("transformer_lens")
    assert_same_run(inst.model, tl_model, inst.probe["tokens"], tol=1e-5)


def test_in_float64_the_two_agree_to_round_off() -> None:
    torch.set_num_threads(1)
    inst = cached_instance("fact-storage", 0, "hard")  # MLPs, 7 layers: the longest path
    model = copy.deepcopy(inst.model).double()
    assert_same_run(model, to_transformer_lens(model), inst.probe["tokens"], tol=1e-9)


def test_the_export_holds_the_public_weights_and_nothing_else() -> None:
    inst = cached_instance("induction-circuit", 0, "easy")
    state = inst.to_transformer_lens().state_dict()
    ours = inst.model.state_dict()
    extra = {k for k in state if not k.endswith(("attn.mask", "attn.IGNORE"))} - set(ours)
    assert not extra, extra
    assert all(torch.equal(state[k], v) for k, v in ours.items())


def test_a_non_transformer_family_says_it_cannot_export() -> None:
    inst = cached_instance("dead-neurons", 0, "easy")
    with pytest.raises(TypeError, match="only the transformer families export"):
        inst.to_transformer_lens()
