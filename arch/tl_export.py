"""Export a public model to a real TransformerLens ``HookedTransformer``, for notebook work outside the sandbox.

Why: researchers keep their own TransformerLens notebooks (circuit plots, path patching helpers, the head
detector). Our ``HookedTransformer`` already follows TransformerLens's parameter names, shapes and hook names,
and has no LayerNorm, so the export is a config translation plus a state-dict copy; what it needs is proof that
nothing is lost on the way (tests/test_transformer_lens_export.py compares logits and every cached activation on
the instance's probe batch within 1e-5).

Only the public weights cross: the exported model is built from ``model.cfg`` and ``model.state_dict()``, so it
can carry nothing the sandbox's model does not (never the truth, which lives on the ``Instance``, not the model).

TransformerLens is an optional extra (``pip install 'mechsandbox[tl]'``). Its 4.0 release removed
``HookedTransformer`` (models are then built through ``TransformerBridge`` from a Hugging Face architecture,
which has no LayerNorm-free variant to map ours onto), so the extra pins the 3.x line, the last with it.
"""

from __future__ import annotations

import warnings
from typing import Any

from .hooked import HookedTransformer

# Buffers TransformerLens keeps that our model computes on the fly (the causal mask, the masking constant).
_TL_ONLY_BUFFERS = ("attn.mask", "attn.IGNORE")


def _transformer_lens() -> Any:
    try:
        import transformer_lens
    except ImportError as exc:
        raise ImportError("to_transformer_lens needs TransformerLens 3.x: pip install 'mechsandbox[tl]'") from exc
    try:  # TransformerLens 4 raises ImportError on the removed name
        transformer_lens.HookedTransformer  # noqa: B018
    except (ImportError, AttributeError) as exc:
        version = getattr(transformer_lens, "__version__", "this version")
        raise ImportError(
            f"TransformerLens {version} has no HookedTransformer (removed in 4.0): pip install 'transformer-lens<4'"
        ) from exc
    return transformer_lens


def tl_config_dict(model: HookedTransformer) -> dict[str, Any]:
    """The ``HookedTransformerConfig`` arguments that describe ``model`` exactly."""
    cfg = model.cfg
    return {
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "d_vocab": cfg.d_vocab,
        "n_ctx": cfg.n_ctx,
        "d_mlp": cfg.d_mlp,
        "attn_only": cfg.attn_only,
        "act_fn": cfg.act_fn,
        "normalization_type": cfg.normalization_type,
        "positional_embedding_type": cfg.positional_embedding_type,
        "default_prepend_bos": False,  # our probes carry no BOS token
        "use_attn_result": False,
        "dtype": next(model.parameters()).dtype,
    }


def to_transformer_lens(model: HookedTransformer, device: str = "cpu") -> Any:
    """A ``transformer_lens.HookedTransformer`` with ``model``'s weights; its logits and activations equal ours."""
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"only the transformer families export to TransformerLens, not {type(model).__name__}")
    tl = _transformer_lens()
    with warnings.catch_warnings():  # 3.x warns that 4.0 removes HookedTransformer: the reason [tl] pins < 4
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="transformer_lens")
        tl_model = tl.HookedTransformer(tl.HookedTransformerConfig(**tl_config_dict(model), device=device))
    ours = {name: t.detach().clone() for name, t in model.state_dict().items()}
    missing, unexpected = tl_model.load_state_dict(ours, strict=False)
    missing = [m for m in missing if not m.endswith(_TL_ONLY_BUFFERS)]
    if missing or unexpected:
        raise RuntimeError(f"TransformerLens export mismatch: missing {missing}, unexpected {unexpected}")
    return tl_model.eval()
