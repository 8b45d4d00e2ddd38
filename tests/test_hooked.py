"""The hooked transformer against TransformerLens' documented behaviour: names, shapes, cache
indexing and helpers, hooks that edit or replace activations, backward hooks, weight views."""

from __future__ import annotations

import pytest
import torch
from helpers import cached_instance
from mechsandbox.arch.hooked import ActivationCache, HookedConfig, HookedTransformer, get_act_name, utils


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return cached_instance("induction-circuit", 0, "easy").model


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return cached_instance("induction-circuit", 0, "easy").probe["tokens"][:4]


def test_get_act_name_matches_transformer_lens() -> None:
    assert get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert get_act_name("attn", 1) == "blocks.1.attn.hook_pattern"
    assert get_act_name("attn_scores", 1) == "blocks.1.attn.hook_attn_scores"
    assert get_act_name("z", 0) == "blocks.0.attn.hook_z"
    assert get_act_name("q", 1) == "blocks.1.attn.hook_q"
    assert get_act_name("result", 1) == "blocks.1.attn.hook_result"
    assert get_act_name("resid_pre", 0) == "blocks.0.hook_resid_pre"
    assert get_act_name("resid_post", 1) == "blocks.1.hook_resid_post"
    assert get_act_name("attn_out", 0) == "blocks.0.hook_attn_out"
    assert get_act_name("mlp_out", 2) == "blocks.2.hook_mlp_out"
    assert get_act_name("pre", 1) == "blocks.1.mlp.hook_pre"
    assert get_act_name("post", 0) == "blocks.0.mlp.hook_post"
    assert get_act_name("embed") == "hook_embed"
    assert get_act_name("pos_embed") == "hook_pos_embed"
    assert utils.get_act_name("v", 0) == "blocks.0.attn.hook_v"


def test_hook_names_and_shapes(model: HookedTransformer, tokens: torch.Tensor) -> None:
    cfg = model.cfg
    b, n = tokens.shape
    logits, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    assert logits.shape == (b, n, cfg.d_vocab)
    assert cache["hook_embed"].shape == (b, n, cfg.d_model)
    assert cache["embed"].shape == (b, n, cfg.d_model)
    assert cache["pos_embed"].shape == (b, n, cfg.d_model)
    assert cache["blocks.0.attn.hook_z"].shape == (b, n, cfg.n_heads, cfg.d_head)
    for name in ("q", "k", "v", "z"):
        assert cache[name, 1].shape == (b, n, cfg.n_heads, cfg.d_head)
    assert cache["pattern", 0].shape == (b, cfg.n_heads, n, n)
    assert cache["attn_scores", 0].shape == (b, cfg.n_heads, n, n)
    assert cache["result", 0].shape == (b, n, cfg.n_heads, cfg.d_model)
    assert torch.equal(cache["resid_post", -1], cache["blocks.1.hook_resid_post"])
    assert "blocks.0.hook_resid_mid" not in cache, "attention-only models have no resid_mid"
    assert len(cache) == len(list(cache)) == len(cache.keys())
    assert torch.allclose(cache["pattern", 0].sum(-1), torch.ones(b, cfg.n_heads, n))
    assert torch.all(cache["pattern", 0].triu(1) == 0), "causal"
    assert torch.allclose(cache["result", 1].sum(2) + model.blocks[1].attn.b_O, cache["attn_out", 1], atol=1e-5)


def test_cache_helpers(model: HookedTransformer, tokens: torch.Tensor) -> None:
    logits, cache = model.run_with_cache(tokens)
    acc, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"] and acc.shape[0] == 3
    dec, dlabels = cache.decompose_resid(return_labels=True)
    assert dlabels == ["embed", "pos_embed", "0_attn_out", "1_attn_out"]
    assert torch.allclose(dec.sum(0), cache["resid_post", -1], atol=1e-4)
    heads, hlabels = cache.stack_head_results(return_labels=True)
    assert heads.shape[0] == 2 * model.cfg.n_heads and hlabels[0] == "L0H0"
    rem, rlabels = cache.stack_head_results(return_labels=True, incl_remainder=True)
    assert rlabels[-1] == "remainder"
    assert torch.allclose(rem.sum(0), cache["resid_post", -1], atol=1e-4)
    assert torch.allclose(cache["resid_post", -1] @ model.W_U + model.b_U, logits, atol=1e-4)
    _, one = model.run_with_cache(tokens[:1])
    single = one.remove_batch_dim()
    assert single["embed"].shape == (tokens.shape[1], model.cfg.d_model)
    assert torch.equal(single["pattern", 0], one["pattern", 0][0])


def test_names_filter_and_remove_batch_dim(model: HookedTransformer, tokens: torch.Tensor) -> None:
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    assert sorted(cache.keys()) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, cache = model.run_with_cache(tokens, names_filter="hook_embed")
    assert list(cache.keys()) == ["hook_embed"]
    _, cache = model.run_with_cache(tokens[:1], remove_batch_dim=True)
    assert cache["pattern", 0].shape == (model.cfg.n_heads, tokens.shape[1], tokens.shape[1])
    with pytest.raises(KeyError, match="not in the cache"):
        model.run_with_cache(tokens, names_filter="hook_embed")[1]["pattern", 0]
    # caching leaves no hooks behind
    assert all(not p._handles for p in model.hook_dict.values())


def test_run_with_hooks_edit_replace_and_filter(model: HookedTransformer, tokens: torch.Tensor) -> None:
    clean = model(tokens)
    seen = []

    def zero_head(z, hook):
        seen.append((hook.name, hook.layer()))
        z[:, :, 0] = 0.0

    edited = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
    assert seen == [("blocks.1.attn.hook_z", 1)]
    assert not torch.allclose(edited, clean)
    replaced = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", lambda r, hook: r * 0)])
    assert torch.allclose(replaced, model.b_U.expand_as(replaced))
    names = []
    model.run_with_hooks(
        tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda p, hook: names.append(hook.name))]
    )
    assert names == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert torch.allclose(model(tokens), clean), "hooks are removed after run_with_hooks"
    model.add_hook("blocks.0.hook_resid_pre", lambda r, hook: r * 0)
    assert not torch.allclose(model(tokens), clean)
    model.reset_hooks()
    assert torch.allclose(model(tokens), clean)
    with pytest.raises(KeyError):
        model.add_hook("blocks.9.hook_nothing", lambda r, hook: r)


def test_backward_hooks(model: HookedTransformer, tokens: torch.Tensor) -> None:
    grads = {}

    def save_grad(grad, hook):
        grads[hook.name] = grad.detach()

    loss = model.run_with_hooks(tokens, return_type="loss", bwd_hooks=[("blocks.0.hook_resid_post", save_grad)])
    loss.backward()
    model.reset_hooks()
    model.zero_grad()
    assert grads["blocks.0.hook_resid_post"].shape == (*tokens.shape, model.cfg.d_model)


def test_return_types_and_weight_views(model: HookedTransformer, tokens: torch.Tensor) -> None:
    cfg = model.cfg
    assert model(tokens, return_type=None) is None
    loss = model(tokens, return_type="loss")
    assert loss.dim() == 0 and loss.item() > 0
    assert model(tokens, return_type="loss", loss_per_token=True).shape == (tokens.shape[0], tokens.shape[1] - 1)
    assert model.W_Q.shape == (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head)
    assert model.W_O.shape == (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model)
    assert model.b_Q.shape == (cfg.n_layers, cfg.n_heads, cfg.d_head)
    assert model.W_E.shape == (cfg.d_vocab, cfg.d_model) and model.W_pos.shape == (cfg.n_ctx, cfg.d_model)
    assert model.W_U.shape == (cfg.d_model, cfg.d_vocab) and model.b_U.shape == (cfg.d_vocab,)
    assert cfg.device == "cpu" and cfg.n_ctx == tokens.shape[1]
    assert "blocks.0.attn.W_Q" in model.state_dict()
    with pytest.raises(ValueError, match="n_ctx"):
        model(torch.zeros(1, cfg.n_ctx + 1, dtype=torch.long))
    assert model(tokens[0]).shape == (1, tokens.shape[1], cfg.d_vocab), "a 1-D token list is one sequence"


def test_mlp_variant_has_mlp_hooks() -> None:
    cfg = HookedConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=5, n_ctx=4, d_mlp=16, attn_only=False)
    m = HookedTransformer(cfg)
    _, cache = m.run_with_cache(torch.tensor([[0, 1, 2, 3]]))
    assert cache["pre", 0].shape == (1, 4, 16) and cache["post", 0].shape == (1, 4, 16)
    assert "blocks.0.hook_resid_mid" in cache and "blocks.0.hook_mlp_out" in cache
    assert m.W_in.shape == (1, 8, 16) and m.W_out.shape == (1, 16, 8)
    assert cache.accumulated_resid(incl_mid=True, return_labels=True)[1] == ["0_pre", "0_mid", "final_post"]


def test_factored_circuits_match_their_products(model: HookedTransformer) -> None:
    """model.OV / model.QK against the dense products: SVD (TransformerLens's U diag(S) Vh^T), the non-zero
    eigenvalues, the norm, indexing by (layer, head) and composition with the embedding and unembedding."""
    dense = model.W_V @ model.W_O
    ov = model.OV
    assert tuple(ov.shape) == tuple(dense.shape) and torch.allclose(ov.AB, dense)
    u, s, vh = ov.svd()
    assert torch.allclose(u @ torch.diag_embed(s) @ vh.transpose(-2, -1), dense, atol=1e-4)
    assert torch.allclose(s, torch.linalg.svdvals(dense)[..., : s.shape[-1]], atol=1e-4)
    assert torch.allclose(ov.norm(), dense.norm(dim=(-2, -1)), rtol=1e-4)
    head = ov[1, 2]
    big = torch.linalg.eigvals(head.AB.double())
    small = head.eigenvalues.to(torch.complex128)
    top = big[big.abs().argsort(descending=True)][: small.shape[0]]
    assert torch.allclose(small[small.abs().argsort(descending=True)].abs(), top.abs(), atol=1e-3)
    full = model.W_E @ ov @ model.W_U
    assert torch.allclose(full.AB, model.W_E @ dense @ model.W_U, atol=1e-3)
    assert torch.allclose(model.QK.AB, model.W_Q @ model.W_K.transpose(-2, -1))
    assert torch.allclose(model.QK.T.AB, model.QK.AB.transpose(-2, -1))
    with pytest.raises(IndexError, match="leading dims"):
        ov[0, 0, 0]
