"""A small hooked transformer with the TransformerLens surface, shared by every transformer family.

Why: agents and researchers trained on TransformerLens tutorials should feel at home, so hook
names, tensor shapes, parameter names and the cache API follow TransformerLens (``HookedTransformer``,
``ActivationCache``, ``utils.get_act_name``). Hook points are identity modules; a hook function is
called as ``fn(tensor, hook=hook_point)`` and may edit the tensor in place or return a replacement.
The models here have no LayerNorm, so every ``apply_ln`` option is the identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .tensors import is_plain_array_data

HookFn = Callable[..., Any]
NameFilter = None | str | Sequence[str] | Callable[[str], bool]


@dataclass
class HookedConfig:
    """The public architecture (``model.cfg``); nothing in it depends on the planted answer."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    d_mlp: int | None = None
    attn_only: bool = True
    act_fn: str = "relu"
    normalization_type: str | None = None
    positional_embedding_type: str = "standard"
    device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HookPoint(nn.Module):
    """Identity module where hooks attach; ``name`` is its full TransformerLens name."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""
        self._handles: list[Any] = []

    def layer(self) -> int:
        """The block index of this hook point (raises for hooks outside blocks, as TransformerLens)."""
        parts = self.name.split(".")
        if len(parts) < 2 or parts[0] != "blocks":
            raise ValueError(f"hook {self.name} is not inside a block")
        return int(parts[1])

    def add_hook(self, fn: HookFn, dir: str = "fwd") -> None:
        if dir == "fwd":

            def fwd(module: nn.Module, inputs: Any, output: torch.Tensor) -> Any:
                return fn(output, hook=self)

            self._handles.append(self.register_forward_hook(fwd))
        elif dir == "bwd":

            def bwd(module: nn.Module, grad_input: Any, grad_output: Any) -> Any:
                out = fn(grad_output[0], hook=self)
                return None if out is None else (out,)

            self._handles.append(self.register_full_backward_hook(bwd))
        else:
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __repr__(self) -> str:
        return "HookPoint()"


class Attention(nn.Module):
    def __init__(self, cfg: HookedConfig):
        super().__init__()
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.zeros(h, d, dh))
        self.W_K = nn.Parameter(torch.zeros(h, d, dh))
        self.W_V = nn.Parameter(torch.zeros(h, d, dh))
        self.W_O = nn.Parameter(torch.zeros(h, dh, d))
        self.b_Q = nn.Parameter(torch.zeros(h, dh))
        self.b_K = nn.Parameter(torch.zeros(h, dh))
        self.b_V = nn.Parameter(torch.zeros(h, dh))
        self.b_O = nn.Parameter(torch.zeros(d))
        self.attn_scale = math.sqrt(dh)
        self.register_buffer("mask", self._causal_mask(), persistent=False)
        for name in ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z", "hook_result"):
            setattr(self, name, HookPoint())

    def _causal_mask(self) -> torch.Tensor:
        return torch.tril(torch.ones(self.cfg.n_ctx, self.cfg.n_ctx, dtype=torch.bool, device="cpu"))

    def rebuild_buffers(self) -> None:
        """The causal mask again (it is not saved with the weights), for a model built on the meta device."""
        self.mask = self._causal_mask()

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        q = self.hook_q(torch.einsum("bpd,hde->bphe", resid, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("bpd,hde->bphe", resid, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("bpd,hde->bphe", resid, self.W_V) + self.b_V)
        n = resid.shape[1]
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / self.attn_scale
        scores = scores.masked_fill(~self.mask[:n, :n], float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        if not self.hook_result._handles:
            # nobody looks at per-head results: skip the [batch, pos, head, d_model] tensor (as
            # TransformerLens does without use_attn_result); identical output, n_heads times cheaper
            return torch.einsum("bqhe,hed->bqd", z, self.W_O) + self.b_O
        result = self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O))
        return result.sum(dim=2) + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg: HookedConfig):
        super().__init__()
        assert cfg.d_mlp is not None
        self.W_in = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.zeros(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        return self.hook_post(F.relu(pre)) @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, cfg: HookedConfig):
        super().__init__()
        self.attn = Attention(cfg)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()
        if not cfg.attn_only:
            self.mlp = MLP(cfg)
            self.hook_resid_mid = HookPoint()
            self.hook_mlp_out = HookPoint()

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        resid = self.hook_resid_pre(resid)
        resid = resid + self.hook_attn_out(self.attn(resid))
        if hasattr(self, "mlp"):
            resid = self.hook_resid_mid(resid)
            resid = resid + self.hook_mlp_out(self.mlp(resid))
        return self.hook_resid_post(resid)


class Embed(nn.Module):
    def __init__(self, cfg: HookedConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.zeros(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg: HookedConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.zeros(cfg.n_ctx, cfg.d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_pos[: tokens.shape[-1]].unsqueeze(0).expand(tokens.shape[0], -1, -1)


class Unembed(nn.Module):
    def __init__(self, cfg: HookedConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        return resid @ self.W_U + self.b_U


def _name_matcher(names: NameFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda name: True
    if isinstance(names, str):
        return lambda name: name == names
    if callable(names):
        return names
    wanted = set(names)
    return lambda name: name in wanted


class HookContext:
    """What ``model.hooks(...)`` returns: a context manager with nothing public (a generator-based one would hand a
    snippet the generator and the unwrapped function). Hooks are added on entry; a bad name removes the ones
    added before it."""

    __slots__ = ("_bwd", "_fwd", "_marks", "_model", "_reset")

    def __init__(self, model: HookedTransformer, fwd: list, bwd: list, reset: bool):
        self._model, self._fwd, self._bwd, self._reset = model, fwd, bwd, reset
        self._marks: list = []

    def __enter__(self) -> HookedTransformer:
        self._marks = self._model._hook_marks()
        try:
            for name, fn in self._fwd:
                self._model.add_hook(name, fn, dir="fwd")
            for name, fn in self._bwd:
                self._model.add_hook(name, fn, dir="bwd")
        except BaseException:
            self._model._remove_hooks_since(self._marks)
            raise
        return self._model

    def __exit__(self, *exc: Any) -> None:
        if self._reset:
            self._model._remove_hooks_since(self._marks)

    def __repr__(self) -> str:
        return "<hook context>"


class Tokenizer:
    """A readable vocabulary for the token families: token i is the string ``t{i}``; text is the token strings
    separated by spaces, so ``decode`` and ``encode`` round-trip. (These models are trained on no language:
    the names only make tokens printable and typeable, in TransformerLens's string helpers too.)"""

    def __init__(self, d_vocab: int):
        self.vocab_size = d_vocab

    def convert_ids_to_tokens(self, ids: Any) -> list[str]:
        return [f"t{int(i)}" for i in torch.as_tensor(ids).flatten().tolist()]

    def decode(self, ids: Any) -> str:
        return " ".join(self.convert_ids_to_tokens(ids))

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in str(text).split():
            body = word[1:]
            if not (word.startswith("t") and body.isdigit() and int(body) < self.vocab_size):
                raise ValueError(f"{word!r} is not a token: tokens are t0 .. t{self.vocab_size - 1}")
            ids.append(int(body))
        return ids

    def __repr__(self) -> str:
        return f"Tokenizer(tokens t0 .. t{self.vocab_size - 1})"


class HookedTransformer(nn.Module):
    """An attention-only (or attention + MLP) transformer with TransformerLens names and hooks."""

    def __init__(self, cfg: HookedConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.unembed = Unembed(cfg)
        self.tokenizer = Tokenizer(cfg.d_vocab)
        self.hook_dict: dict[str, HookPoint] = {}
        self.mod_dict: dict[str, nn.Module] = {}
        for name, module in self.named_modules():
            if name:
                self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    # -- forward --------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, return_type: str | None = "logits", loss_per_token: bool = False) -> Any:
        tokens = torch.as_tensor(tokens)
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.shape[-1] > self.cfg.n_ctx:
            raise ValueError(f"sequence length {tokens.shape[-1]} exceeds n_ctx={self.cfg.n_ctx}")
        resid = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(tokens))
        for block in self.blocks:
            resid = block(resid)
        if return_type is None:
            return None
        logits = self.unembed(resid)
        if return_type == "logits":
            return logits
        if return_type in ("loss", "both"):
            logp = F.log_softmax(logits[:, :-1], dim=-1)
            nll = -logp.gather(-1, tokens[:, 1:, None])[..., 0]
            loss = nll if loss_per_token else nll.mean()
            return loss if return_type == "loss" else (logits, loss)
        raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, got {return_type!r}")

    # -- strings (TransformerLens's helpers over the readable vocabulary) -----------------
    def to_tokens(self, text: str | list[str], prepend_bos: bool = False) -> torch.Tensor:
        """``"t3 t17 t5"`` -> tensor [[3, 17, 5]] (a list of strings gives one row each, equal lengths). These
        models have no BOS token, so ``prepend_bos`` is refused rather than silently shifting positions."""
        if prepend_bos:
            raise ValueError("these models have no BOS token; pass prepend_bos=False")
        rows = [text] if isinstance(text, str) else list(text)
        ids = [self.tokenizer.encode(row) for row in rows]
        if len({len(r) for r in ids}) > 1:
            raise ValueError("to_tokens needs strings of equal length (there is no padding token)")
        return torch.tensor(ids, dtype=torch.long)

    def to_str_tokens(self, tokens: Any, prepend_bos: bool = False) -> list:
        """Token ids (or a string) -> their strings: a list for one sequence, a list of lists for a batch."""
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens, prepend_bos=prepend_bos)
        t = torch.as_tensor(tokens)
        if t.dim() <= 1:
            return self.tokenizer.convert_ids_to_tokens(t)
        if t.dim() == 2 and t.shape[0] == 1:
            return self.tokenizer.convert_ids_to_tokens(t[0])
        return [self.to_str_tokens(row) for row in t]

    def to_string(self, tokens: Any) -> str | list[str]:
        """Token ids -> text (one string per row of a batch); ``to_tokens`` reads it back."""
        t = torch.as_tensor(tokens)
        return self.tokenizer.decode(t) if t.dim() <= 1 else [self.tokenizer.decode(row) for row in t]

    @torch.no_grad()
    def generate(self, input: Any, max_new_tokens: int = 4, do_sample: bool = False, **kwargs: Any) -> Any:
        """Greedy continuation (TransformerLens's ``generate`` without sampling), up to the context length;
        text in, text out."""
        if do_sample:
            raise ValueError("generate samples nothing here: it is greedy (do_sample=False)")
        as_text = isinstance(input, str)
        tokens = self.to_tokens(input) if as_text else torch.as_tensor(input)
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        for _ in range(max(0, min(int(max_new_tokens), self.cfg.n_ctx - tokens.shape[1]))):
            nxt = self(tokens)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
        return self.to_string(tokens[0]) if as_text else tokens

    # -- hooks ----------------------------------------------------------------------------
    def add_hook(self, name: str | Callable[[str], bool], hook: HookFn, dir: str = "fwd") -> None:
        if isinstance(name, str):
            if name not in self.hook_dict:
                raise KeyError(f"no hook point named {name!r} (see model.hook_dict)")
            self.hook_dict[name].add_hook(hook, dir=dir)
            return
        for hook_name, point in self.hook_dict.items():
            if name(hook_name):
                point.add_hook(hook, dir=dir)

    def reset_hooks(self) -> None:
        for point in self.hook_dict.values():
            point.remove_hooks()

    def hooks(
        self,
        fwd_hooks: Sequence[tuple] = (),
        bwd_hooks: Sequence[tuple] = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
    ) -> HookContext:
        """TransformerLens's ``with model.hooks(fwd_hooks=[(name, fn)]):``: the hooks are on inside the block;
        at its end (``reset_hooks_end``) the hooks it added are removed, those added before it stay.
        ``clear_contexts`` is accepted for TransformerLens's signature (this model keeps no hook contexts)."""
        return HookContext(self, list(fwd_hooks), list(bwd_hooks), reset_hooks_end)

    def _hook_marks(self) -> list[tuple[HookPoint, int]]:
        return [(point, len(point._handles)) for point in self.hook_dict.values()]

    @staticmethod
    def _remove_hooks_since(marks: list[tuple[HookPoint, int]]) -> None:
        """Remove the hooks added to each point after ``marks`` was taken (earlier ones stay)."""
        for point, before in marks:
            for handle in point._handles[before:]:
                handle.remove()
            del point._handles[before:]

    def run_with_hooks(
        self,
        tokens: torch.Tensor,
        *args: Any,
        fwd_hooks: Sequence[tuple] = (),
        bwd_hooks: Sequence[tuple] = (),
        reset_hooks_end: bool = True,
        **kwargs: Any,
    ) -> Any:
        for name, fn in fwd_hooks:
            self.add_hook(name, fn, dir="fwd")
        for name, fn in bwd_hooks:
            self.add_hook(name, fn, dir="bwd")
        try:
            return self(tokens, *args, **kwargs)
        finally:
            if reset_hooks_end and not bwd_hooks:
                self.reset_hooks()

    def run_with_cache(
        self,
        tokens: torch.Tensor,
        *args: Any,
        names_filter: NameFilter = None,
        remove_batch_dim: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        match = _name_matcher(names_filter)
        store: dict[str, torch.Tensor] = {}

        def save(tensor: torch.Tensor, hook: HookPoint) -> None:
            t = tensor.detach()
            store[hook.name] = t[0] if remove_batch_dim else t

        marks = [(p, len(p._handles)) for n, p in self.hook_dict.items() if match(n)]
        for point, _ in marks:
            point.add_hook(save)
        try:
            out = self(tokens, *args, **kwargs)
        finally:
            self._remove_hooks_since(marks)
        return out, ActivationCache(store, self.cfg, has_batch_dim=not remove_batch_dim, model=self)

    # -- weight views (TransformerLens shapes: [n_layers, n_heads, ...]) -------------------
    def _stack(self, attr: str) -> torch.Tensor:
        return torch.stack([getattr(b.attn, attr) for b in self.blocks])

    W_Q = property(lambda self: self._stack("W_Q"))
    W_K = property(lambda self: self._stack("W_K"))
    W_V = property(lambda self: self._stack("W_V"))
    W_O = property(lambda self: self._stack("W_O"))
    b_Q = property(lambda self: self._stack("b_Q"))
    b_K = property(lambda self: self._stack("b_K"))
    b_V = property(lambda self: self._stack("b_V"))
    b_O = property(lambda self: self._stack("b_O"))
    W_E = property(lambda self: self.embed.W_E)
    W_pos = property(lambda self: self.pos_embed.W_pos)
    W_U = property(lambda self: self.unembed.W_U)
    b_U = property(lambda self: self.unembed.b_U)
    W_in = property(lambda self: torch.stack([b.mlp.W_in for b in self.blocks]))
    W_out = property(lambda self: torch.stack([b.mlp.W_out for b in self.blocks]))
    b_in = property(lambda self: torch.stack([b.mlp.b_in for b in self.blocks]))
    b_out = property(lambda self: torch.stack([b.mlp.b_out for b in self.blocks]))

    # -- factored circuits (TransformerLens: model.OV, model.QK) ----------------------------
    @property
    def OV(self) -> FactoredMatrix:
        """Every head's OV circuit W_V W_O as a factored [n_layers, n_heads, d_model, d_model] matrix."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self) -> FactoredMatrix:
        """Every head's QK circuit W_Q W_K^T as a factored [n_layers, n_heads, d_model, d_model] matrix."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))


def eigvals_checked(A: torch.Tensor, *, out: Any = None) -> torch.Tensor:
    """``torch.linalg.eigvals`` that refuses NaN and inf: torch 2.13's CPU build hands them to MKL's xGEBAL, which
    segfaults (float32) or corrupts the heap (float64) instead of raising, as ``torch.linalg.eig`` does. The
    sandbox's ``torch.linalg.eigvals`` and ``FactoredMatrix.eigenvalues`` both go through here."""
    if out is not None:
        raise ValueError("eigvals(out=...) is not available in the sandbox; use the returned tensor")
    a = torch.as_tensor(A)
    if not bool(torch.isfinite(a).all()):
        raise ValueError("eigvals: the matrix has NaN or inf entries")
    return torch.linalg.eigvals(a)


class FactoredMatrix:
    """A product A @ B kept as its factors (TransformerLens's ``FactoredMatrix``, the part interpretability
    code uses): ``.AB``, ``.BA``, ``.T``, ``.svd()`` (U, S, Vh with U @ diag(S) @ Vh^T == AB, TransformerLens's
    convention), ``.S``, ``.U``, ``.Vh``, ``.eigenvalues`` (of AB, computed from the small BA), ``.norm()``,
    ``.shape``, ``@`` with tensors or factored matrices, and indexing over the leading (layer, head) dims.
    Why factored: a head's circuit has rank <= d_head, so its SVD comes from [d_head, d_head] matrices."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor):
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(f"factors do not chain: {tuple(A.shape)} @ {tuple(B.shape)}")
        self.A, self.B = A, B

    @property
    def AB(self) -> torch.Tensor:
        return self.A @ self.B

    @property
    def BA(self) -> torch.Tensor:
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2]),
                           self.A.shape[-2], self.B.shape[-1]))  # fmt: skip

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(U, S, Vh) with U @ diag(S) @ Vh^T == AB, from the thin factors' SVDs (rank <= the inner dim)."""
        ua, sa, vha = torch.linalg.svd(self.A, full_matrices=False)
        ub, sb, vhb = torch.linalg.svd(self.B, full_matrices=False)
        middle = (sa[..., :, None] * vha) @ (ub * sb[..., None, :])
        um, s, vhm = torch.linalg.svd(middle, full_matrices=False)
        u = ua @ um
        v = vhb.transpose(-2, -1) @ vhm.transpose(-2, -1)
        return u, s, v

    @property
    def U(self) -> torch.Tensor:
        return self.svd()[0]

    @property
    def S(self) -> torch.Tensor:
        return self.svd()[1]

    @property
    def Vh(self) -> torch.Tensor:
        return self.svd()[2]

    @property
    def eigenvalues(self) -> torch.Tensor:
        """The eigenvalues of AB that can be non-zero: those of BA (complex in general)."""
        return eigvals_checked(self.BA)  # BA may overflow to inf even when A and B are finite

    def norm(self) -> torch.Tensor:
        """The Frobenius norm of AB (from the singular values)."""
        return self.S.pow(2).sum(-1).sqrt()

    def __matmul__(self, other: Any) -> FactoredMatrix:
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A, self.B @ other.AB)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Any) -> FactoredMatrix:
        return FactoredMatrix(other @ self.A, self.B)

    def __getitem__(self, idx: Any) -> FactoredMatrix:
        """Index the leading (layer, head) dims: ``model.OV[1, 4]`` is one head's circuit."""
        lead = len(self.shape) - 2
        parts = idx if isinstance(idx, tuple) else (idx,)
        if len(parts) > lead:
            raise IndexError(f"a factored matrix indexes its {lead} leading dims only; use .AB for entries")
        return FactoredMatrix(self.A[parts], self.B[parts])

    def __repr__(self) -> str:
        return f"FactoredMatrix: shape {tuple(self.shape)}, inner dim {self.A.shape[-1]}"


# ---------------------------------------------------------------------------------------
# names and the cache
# ---------------------------------------------------------------------------------------
_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_post": "post",
}
_ATTN = {"q", "k", "v", "z", "result", "pattern", "attn_scores"}
_MLP = {"pre", "post"}


def get_act_name(name: str, layer: int | None = None, subtype: str | None = None, layer_type: str | None = None) -> str:
    """TransformerLens' ``utils.get_act_name``: ``("pattern", 0)`` -> ``blocks.0.attn.hook_pattern``."""
    if not isinstance(name, str):
        raise TypeError("name must be a string such as 'pattern' or 'resid_post'")
    if "." in name or name.startswith("hook_"):
        return name
    name = _ALIASES.get(name, name)
    layer_type = layer_type or subtype
    full = f"blocks.{int(layer)}." if layer is not None else ""
    if name in _ATTN:
        layer_type = "attn"
    elif name in _MLP:
        layer_type = "mlp"
    elif layer_type in ("a", "attn"):
        layer_type = "attn"
    elif layer_type in ("m", "mlp"):
        layer_type = "mlp"
    else:
        layer_type = None
    if layer_type and layer is not None:
        full += f"{layer_type}."
    return full + f"hook_{name}"


def to_numpy(tensor: Any) -> np.ndarray:
    """TransformerLens' ``utils.to_numpy``: tensors, arrays, numbers and plain (nested) lists or tuples of them only,
    so no object's interface protocol (``__array_interface__`` and the like) is honoured (``is_plain_array_data``)."""
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().cpu().numpy()
    if not is_plain_array_data(tensor):
        raise TypeError(f"to_numpy takes a tensor, an array, a number or a plain list, not {type(tensor).__name__!r}")
    return np.asarray(tensor)


class ActivationCache:
    """The cache returned by ``run_with_cache``: full names, ``cache["pattern", 0]``, short keys."""

    def __init__(
        self,
        store: dict[str, torch.Tensor],
        cfg: HookedConfig,
        has_batch_dim: bool = True,
        model: HookedTransformer | None = None,
    ):
        self.cache_dict = store
        self.cfg = cfg
        self.has_batch_dim = has_batch_dim
        self.model = model  # as TransformerLens's cache: logit_attrs reads its unembedding

    def _key(self, key: Any) -> str:
        if isinstance(key, str):
            return key if key in self.cache_dict else get_act_name(key)
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            name, layer, *rest = key
            if layer is not None and layer < 0:
                layer = self.cfg.n_layers + layer
            return get_act_name(name, layer, *rest)
        raise KeyError(
            f"cache keys are names ('blocks.0.attn.hook_pattern', 'embed') or (name, layer) tuples, got {key!r}"
        )

    def __getitem__(self, key: Any) -> torch.Tensor:
        full = self._key(key)
        if full not in self.cache_dict:
            raise KeyError(f"{full!r} is not in the cache (was it filtered out by names_filter?)")
        return self.cache_dict[full]

    def __contains__(self, key: Any) -> bool:
        try:
            return self._key(key) in self.cache_dict
        except KeyError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"

    def remove_batch_dim(self) -> ActivationCache:
        if not self.has_batch_dim:
            return self
        store = {k: v[0] for k, v in self.cache_dict.items()}
        return ActivationCache(store, self.cfg, has_batch_dim=False, model=self.model)

    @staticmethod
    def _slice(t: torch.Tensor, pos_slice: Any) -> torch.Tensor:
        return t if pos_slice is None else t[..., pos_slice, :]

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: Any = None,
        return_labels: bool = False,
    ) -> Any:
        """The residual stream before each layer up to ``layer`` (and the final one at n_layers)."""
        n = self.cfg.n_layers
        layer = n if layer is None else (layer + n + 1 if layer < 0 else layer)
        parts, labels = [], []
        for lay in range(layer):
            if lay < n:
                parts.append(self[("resid_pre", lay)])
                labels.append(f"{lay}_pre")
                if incl_mid and not self.cfg.attn_only:
                    parts.append(self[("resid_mid", lay)])
                    labels.append(f"{lay}_mid")
        if layer == n:
            parts.append(self[("resid_post", n - 1)])
            labels.append("final_post")
        stack = torch.stack([self._slice(p, pos_slice) for p in parts])
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: Any = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Any:
        """Embeddings, then each layer's attention (and MLP) output, up to ``layer``."""
        n = self.cfg.n_layers
        layer = n if layer is None else layer
        parts, labels = [], []
        if incl_embeds:
            parts += [self["hook_embed"], self["hook_pos_embed"]]
            labels += ["embed", "pos_embed"]
        for lay in range(layer):
            if mode in ("all", "attn"):
                parts.append(self[("attn_out", lay)])
                labels.append(f"{lay}_attn_out")
            if mode in ("all", "mlp") and not self.cfg.attn_only:
                parts.append(self[("mlp_out", lay)])
                labels.append(f"{lay}_mlp_out")
        if mlp_input and layer < n and not self.cfg.attn_only and mode in ("all", "attn"):
            parts.append(self[("attn_out", layer)])
            labels.append(f"{layer}_attn_out")
        stack = torch.stack([self._slice(p, pos_slice) for p in parts])
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: Any = None,
        apply_ln: bool = False,
    ) -> Any:
        """Each head's output [n_heads*layers, ..., d_model] (heads of layers < ``layer``; -1 = all)."""
        n = self.cfg.n_layers
        layer = n if layer == -1 else layer
        parts, labels = [], []
        for lay in range(layer):
            res = self[("result", lay)]  # [..., pos, head, d_model]
            for h in range(self.cfg.n_heads):
                parts.append(res[..., h, :])
                labels.append(f"L{lay}H{h}")
        stack = torch.stack([self._slice(p, pos_slice) for p in parts])
        if incl_remainder:
            final = self._slice(self[("resid_post", layer - 1)] if layer > 0 else self["hook_embed"], pos_slice)
            stack = torch.cat([stack, (final - stack.sum(0))[None]])
            labels.append("remainder")
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        residual_stack: torch.Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
    ) -> torch.Tensor:
        """TransformerLens's scaling of a residual stack by the LayerNorm at ``layer``: these models have no
        LayerNorm (``cfg.normalization_type`` is None), so, as in TransformerLens then, the stack itself."""
        if self.cfg.normalization_type is not None:
            raise NotImplementedError(f"apply_ln_to_stack with normalization_type={self.cfg.normalization_type!r}")
        stack = residual_stack  # [..., batch, pos, d_model]
        if batch_slice is not None and has_batch_dim:
            stack = stack[..., batch_slice, :, :]
        return self._slice(stack, pos_slice)

    def logit_attrs(
        self,
        residual_stack: torch.Tensor,
        tokens: Any,
        incorrect_tokens: Any = None,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
    ) -> torch.Tensor:
        """Each component's direct contribution to the logit of ``tokens`` (minus that of ``incorrect_tokens``):
        the stack [..., d_model] dotted with the tokens' unembedding columns, as TransformerLens computes it.
        ``tokens`` is a token id or a tensor of ids that broadcasts against the stack's leading dims."""
        if self.model is None:
            raise ValueError("this cache has no model; use the one run_with_cache returns")
        w_u = self.model.W_U  # [d_model, d_vocab]

        def directions(toks: Any) -> torch.Tensor:
            return w_u.T[torch.as_tensor(toks, dtype=torch.long)]  # [..., d_model]

        dirs = directions(tokens) if incorrect_tokens is None else directions(tokens) - directions(incorrect_tokens)
        stack = self.apply_ln_to_stack(residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice,
                                       has_batch_dim=has_batch_dim)  # fmt: skip
        return (stack * dirs).sum(-1)


class Utils:
    """The ``utils`` object in the sandbox namespace (a TransformerLens subset)."""

    get_act_name = staticmethod(get_act_name)
    to_numpy = staticmethod(to_numpy)


utils = Utils()
