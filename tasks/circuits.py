"""Hand-planting circuits into a :class:`~mechsandbox.arch.HookedTransformer`.

Why: the transformer families plant heads with exact jobs (copy a marked token, attend to the
previous position, compose across layers). Writing them in a readable, unrotated basis -- named
subspaces of the residual stream such as ``tok``, ``out``, ``pos`` -- keeps each construction short
and checkable. :meth:`Planter.build` then hides that basis: a random orthogonal rotation of the
residual stream, a random rotation inside every head (which leaves QK and OV unchanged), optional
a random rescaling of Q against K and V against O, optional dense noise on every weight, and
quantisation to the 2**-16 grid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..answer_kind import AnswerKind
from ..arch import HookedConfig, HookedTransformer
from .base import Instance
from .rng import Stream, quantise


@dataclass
class Layout:
    """Named, disjoint subspaces of the (unrotated) residual stream."""

    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    size: int = 0

    def add(self, name: str, dim: int) -> None:
        self.spans[name] = (self.size, self.size + dim)
        self.size += dim

    def idx(self, name: str, i: int = 0) -> int:
        start, stop = self.spans[name]
        if not 0 <= i < stop - start:
            raise IndexError(f"{name}[{i}] outside a span of {stop - start}")
        return start + i

    def dim(self, name: str) -> int:
        start, stop = self.spans[name]
        return stop - start


class Planter:
    """Accumulates weights in the unrotated basis, then builds a quantised, rotated model."""

    def __init__(self, cfg: HookedConfig, layout: Layout):
        if layout.size > cfg.d_model:
            raise ValueError(f"layout needs {layout.size} dims, d_model is {cfg.d_model}")
        self.cfg, self.lay = cfg, layout
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        n = cfg.n_layers
        self.W_E = np.zeros((cfg.d_vocab, d))
        self.W_pos = np.zeros((cfg.n_ctx, d))
        self.W_U = np.zeros((d, cfg.d_vocab))
        self.b_U = np.zeros(cfg.d_vocab)
        self.W_Q = np.zeros((n, h, d, dh))
        self.W_K = np.zeros((n, h, d, dh))
        self.W_V = np.zeros((n, h, d, dh))
        self.W_O = np.zeros((n, h, dh, d))
        self.b_Q = np.zeros((n, h, dh))
        self.b_K = np.zeros((n, h, dh))
        m = cfg.d_mlp or 0
        self.W_in = np.zeros((n, d, m))
        self.b_in = np.zeros((n, m))
        self.W_out = np.zeros((n, m, d))
        self.mlp_used = [0] * n

    def embed_basics(self, out_gain: float) -> None:
        """The shared embedding: each token's identity in ``tok`` plus a constant feature in ``const``,
        one-hot positions in ``pos``, and an unembedding that reads token t from ``out``[t]."""
        for t in range(self.cfg.d_vocab):
            self.W_E[t, self.lay.idx("tok", t)] = 1.0
            self.W_E[t, self.lay.idx("const")] = 1.0
            self.W_U[self.lay.idx("out", t), t] = out_gain
        for i in range(self.cfg.n_ctx):
            self.W_pos[i, self.lay.idx("pos", i)] = 1.0

    def flag_tokens(self, name: str, tokens: list[int]) -> None:
        """Give the listed tokens a content feature in the one-dim subspace ``name``."""
        for t in tokens:
            self.W_E[t, self.lay.idx(name)] = 1.0

    # -- helpers to write a head ------------------------------------------------------------
    def qk(self, layer: int, head: int, pairs: list[tuple[int, int, float]]) -> None:
        """Score contributions: for each (query residual dim, key residual dim, strength), the
        head's score gains ``strength`` * x_q[dim_q] * x_k[dim_k] (after the 1/sqrt(d_head) scale).
        Each pair uses its own head dimension, so pairs do not interfere (len(pairs) <= d_head)."""
        scale = np.sqrt(np.sqrt(self.cfg.d_head))
        for e, (dq, dk, strength) in enumerate(pairs, start=self.free_qk_dim(layer, head)):
            root = np.sqrt(abs(strength)) * scale
            self.W_Q[layer, head, dq, e] += root * np.sign(strength)
            self.W_K[layer, head, dk, e] += root

    def free_qk_dim(self, layer: int, head: int) -> int:
        """The first head dimension no QK pair uses yet (pairs are planted from dimension 0 on)."""
        return int((np.abs(self.W_Q[layer, head]).sum(0) + np.abs(self.W_K[layer, head]).sum(0) > 0).sum())

    def free_ov_dim(self, layer: int, head: int) -> int:
        """The first head dimension no OV pair uses yet."""
        return int((np.abs(self.W_V[layer, head]).sum(0) > 0).sum())

    def ov(self, layer: int, head: int, pairs: list[tuple[int, int, float]]) -> None:
        """Copy map: for each (source residual dim, destination residual dim, gain), the head
        writes gain * x_src[dim] into the destination dim (one head dimension per pair)."""
        for e, (src, dst, gain) in enumerate(pairs, start=self.free_ov_dim(layer, head)):
            self.W_V[layer, head, src, e] += 1.0
            self.W_O[layer, head, e, dst] += gain

    def mlp_unit(
        self, layer: int, reads: list[tuple[int, float]], bias: float, writes: list[tuple[int, float]]
    ) -> None:
        """One ReLU unit of a layer's MLP: pre = sum(w * x[dim] for reads) + bias; it writes
        relu(pre) * w into each (dim, w) of ``writes``. Units are shuffled by :meth:`build`."""
        u = self.mlp_used[layer]
        if u >= self.W_in.shape[2]:
            raise ValueError(f"layer {layer} has only {self.W_in.shape[2]} MLP units")
        for dim, w in reads:
            self.W_in[layer, dim, u] += w
        self.b_in[layer, u] = bias
        for dim, w in writes:
            self.W_out[layer, u, dim] += w
        self.mlp_used[layer] += 1

    # -- build --------------------------------------------------------------------------------
    def patterns(self, tokens: torch.Tensor, heads: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """Attention patterns [batch, query, key] of ``heads`` in the planted model itself (unrotated,
        noise-free, unquantised), in float64, for calibrating a construction before it is built.

        Why not a forward pass of a built model: a pattern depends only on the residual dims some query or key
        reads, closed under what the OV circuits write into them; in a planted model that is a few dims of the
        layout (marks, flags, "handled" directions), so the pass runs on those alone -- exact for the planted
        weights and about a hundred times cheaper than a whole float64 forward (committee-circuit calibrates
        five committees per construction this way). Attention-only planted models: MLPs are refused."""
        if any(self.mlp_used):
            raise ValueError("Planter.patterns reads attention-only models; this one has MLP units")
        if not heads:
            return {}
        dims = (np.abs(self.W_Q).sum(axis=(0, 1, 3)) + np.abs(self.W_K).sum(axis=(0, 1, 3))) > 0
        while True:  # add every dim an OV circuit reads into a dim already kept
            grown = dims | (np.abs(self.W_V @ self.W_O[..., dims]).sum(axis=(0, 1, 3)) > 0)
            if (grown == dims).all():
                break
            dims = grown
        keep = np.flatnonzero(dims)
        idx = torch.from_numpy(keep)
        t = {name: torch.from_numpy(getattr(self, name)) for name in ("W_Q", "W_K", "b_Q", "b_K")}
        ov_kept = torch.from_numpy(self.W_V[:, :, keep] @ self.W_O[..., keep])  # [layer, head, kept, kept]
        tok = torch.as_tensor(tokens)
        n = tok.shape[1]
        resid = torch.from_numpy(self.W_E[:, keep])[tok] + torch.from_numpy(self.W_pos[:n, keep])[None]  # float64
        future = ~torch.tril(torch.ones(n, n, dtype=torch.bool))
        out: dict[tuple[int, int], np.ndarray] = {}
        for layer in range(max(lay for lay, _ in heads) + 1):
            q = torch.einsum("bpd,hde->bhpe", resid, t["W_Q"][layer][:, idx]) + t["b_Q"][layer][None, :, None]
            k = torch.einsum("bpd,hde->bhpe", resid, t["W_K"][layer][:, idx]) + t["b_K"][layer][None, :, None]
            scores = (q @ k.transpose(-1, -2) / np.sqrt(self.cfg.d_head)).masked_fill(future, float("-inf"))
            pattern = torch.softmax(scores, dim=-1)
            out.update({(layer, h): pattern[:, h].numpy() for lay, h in heads if lay == layer})
            resid = resid + torch.einsum("bhqk,bkd,hdf->bqf", pattern, resid, ov_kept[layer])
        return out

    def build(self, s: Stream, noise: float, rotate: bool = True, off: tuple[str, ...] = ()) -> HookedTransformer:
        """The model: the plan in a random residual basis (``rotate``), with dense ``noise`` on every weight but
        those whose name starts with one of ``off`` (switched-off parts, e.g. head-roles' block-0 attention: left
        exactly zero, and no noise drawn for them: 44-45% of that family's weights)."""
        cfg = self.cfg
        d, dh = cfg.d_model, cfg.d_head
        rot = s.orthogonal(d) if rotate else np.eye(d)
        w_q, w_k, w_v, w_o, b_q, b_k = (a.copy() for a in (self.W_Q, self.W_K, self.W_V, self.W_O, self.b_Q, self.b_K))
        for lay in range(cfg.n_layers):
            for h in range(cfg.n_heads):
                sq, sv = (s.orthogonal(dh), s.orthogonal(dh)) if rotate else (np.eye(dh), np.eye(dh))
                # rescale Q against K and V against O (QK and OV unchanged), so the norm of a single
                # matrix says nothing about the head's job
                cq, cv = (np.exp(s.fraction(-0.7, 0.7)), np.exp(s.fraction(-0.7, 0.7))) if rotate else (1.0, 1.0)
                if not any(w[lay, h].any() for w in (w_q, w_k, w_v, w_o, b_q, b_k)):
                    continue  # a head with nothing planted (head-roles' block 0) stays zero: its draws are made above
                w_q[lay, h] = rot.T @ w_q[lay, h] @ sq * cq
                w_k[lay, h] = rot.T @ w_k[lay, h] @ sq / cq
                b_q[lay, h] = b_q[lay, h] @ sq * cq
                b_k[lay, h] = b_k[lay, h] @ sq / cq
                w_v[lay, h] = rot.T @ w_v[lay, h] @ sv * cv
                w_o[lay, h] = sv.T @ w_o[lay, h] @ rot / cv
        values = {
            "embed.W_E": self.W_E @ rot,
            "pos_embed.W_pos": self.W_pos @ rot,
            "unembed.W_U": rot.T @ self.W_U,
            "unembed.b_U": self.b_U,
        }
        for lay in range(cfg.n_layers if cfg.d_mlp else 0):
            order = s.permutation(cfg.d_mlp)  # unit order says nothing about a unit's job
            if not (self.W_in[lay].any() or self.W_out[lay].any() or self.b_in[lay].any()):
                continue  # an MLP with nothing planted stays zero (the model's default), as rotating it would give
            values[f"blocks.{lay}.mlp.W_in"] = rot.T @ self.W_in[lay][:, order]
            values[f"blocks.{lay}.mlp.b_in"] = self.b_in[lay][order]
            values[f"blocks.{lay}.mlp.W_out"] = self.W_out[lay][order] @ rot
        for lay in range(cfg.n_layers):
            values[f"blocks.{lay}.attn.W_Q"] = w_q[lay]
            values[f"blocks.{lay}.attn.W_K"] = w_k[lay]
            values[f"blocks.{lay}.attn.W_V"] = w_v[lay]
            values[f"blocks.{lay}.attn.W_O"] = w_o[lay]
            values[f"blocks.{lay}.attn.b_Q"] = b_q[lay]
            values[f"blocks.{lay}.attn.b_K"] = b_k[lay]
        model = HookedTransformer(cfg)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.startswith(off):
                    param.zero_()
                    continue
                base = values.get(name, np.zeros(tuple(param.shape)))
                if noise:
                    base = base + s.normal(*param.shape, scale=noise)
                param.copy_(torch.from_numpy(quantise(base)))
        return model.eval()


# ---------------------------------------------------------------------------------------
# behaviour metrics shared by the transformer families
# ---------------------------------------------------------------------------------------
def margin(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logit(target) - max other logit, per row ([..., vocab] logits, [...] targets)."""
    tgt = logits.gather(-1, target[..., None])[..., 0]
    other = logits.scatter(-1, target[..., None], float("-inf")).max(dim=-1).values
    return tgt - other


def _zero_heads_hooks(heads: list[tuple[int, int]]) -> list[tuple[str, Callable]]:
    """hook_z hooks that zero the given heads' outputs at every position."""
    by_layer: dict[int, list[int]] = {}
    for lay, h in heads:
        by_layer.setdefault(lay, []).append(h)

    def make(hs: list[int]):
        def hook(z: torch.Tensor, hook) -> torch.Tensor:
            z[:, :, hs] = 0.0
            return z

        return hook

    return [(f"blocks.{lay}.attn.hook_z", make(hs)) for lay, hs in by_layer.items()]


def ablate_heads(model: HookedTransformer, tokens: torch.Tensor, heads: list[tuple[int, int]]) -> torch.Tensor:
    """Logits with the given heads' outputs zeroed (hook_z), at every position."""
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=_zero_heads_hooks(heads))


class Ablator:
    """Head ablations of one model on one batch that reuse the clean run's residual stream.

    Why: acceptance checks ablate dozens of head sets per candidate model, and that is most of a
    transformer family's generation time. An ablation whose earliest head is in layer L leaves the
    residual stream entering block L exactly as in the clean run, so only blocks L.. are recomputed,
    by the same modules on the same values: the logits are bit-identical to :func:`ablate_heads`.
    """

    def __init__(self, model: HookedTransformer, tokens: torch.Tensor):
        self.model = model
        self.resid_pre: list[torch.Tensor] = []
        with torch.no_grad():
            resid = model.hook_embed(model.embed(tokens)) + model.hook_pos_embed(model.pos_embed(tokens))
            for block in model.blocks:
                self.resid_pre.append(resid)
                resid = block(resid)
            self.clean = model.unembed(resid)

    def logits(self, heads: list[tuple[int, int]]) -> torch.Tensor:
        """Logits with ``heads`` zero-ablated (the clean logits for an empty list)."""
        if not heads:
            return self.clean
        return self.run_from(min(lay for lay, _ in heads), _zero_heads_hooks(heads))

    def run_from(self, start: int, fwd_hooks: list[tuple[str, Callable]]) -> torch.Tensor:
        """Logits of the clean run with ``fwd_hooks`` added, every one of them in block ``start`` or later:
        blocks ``start``.. are run again, on the clean stream entering block ``start`` (a copy: a hook on
        ``hook_resid_pre`` may write into it in place)."""
        model = self.model
        for name, _ in fwd_hooks:
            parts = name.split(".") if isinstance(name, str) else []
            if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit() or int(parts[1]) < start:
                raise ValueError(f"run_from({start}): the hook {name} is not in block {start} or later")
        for name, fn in fwd_hooks:
            model.add_hook(name, fn)
        try:
            with torch.no_grad():
                resid = self.resid_pre[start].clone()
                for block in model.blocks[start:]:
                    resid = block(resid)
                return model.unembed(resid)
        finally:
            model.reset_hooks()


def _attend(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, queries: slice,
            zero: list[int]) -> torch.Tensor:  # fmt: skip
    """Per-head outputs ``z`` [batch, query, head, d_head] from the query positions ``queries``' q and every
    position's k and v (causal), with the heads in ``zero`` zeroed."""
    n = k.shape[1]
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / attn.attn_scale
    scores = scores.masked_fill(~attn.mask[:n, :n][queries], float("-inf"))
    z = torch.einsum("bhqk,bkhe->bqhe", torch.softmax(scores, dim=-1), v)
    if zero:
        z[:, :, zero] = 0.0
    return z


def _qkv(attn: torch.nn.Module, resid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.einsum("bpd,hde->bphe", resid, w) + b
                 for w, b in ((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V)))  # fmt: skip


# Acceptance bounds computed with a QueryAblator are tightened by this. Its logits differ from Ablator's by up to
# about 4e-5 (logits of 20-30), the mean margins by up to about 2e-5 and committee's margin fractions by a few 1e-6
# (tests/test_ablators.py holds margins to a quarter of the guard and fractions to a twentieth).
FAST_GUARD = 1e-4


class QueryAblator:
    """Logits at chosen query positions of zero-ablated head sets in an attention-only model, for acceptance
    checks.

    Why: the transformer families' acceptance checks run dozens of ablations per candidate model (committee
    about 40, induction one per head), which made them most of those families' generation time, while their
    metrics read a few positions. An ablation whose earliest head is in layer L changes nothing below L; in
    layer L (the stream is linear: no LayerNorm, no MLP) it only removes the ablated heads' results
    ``z_h @ W_O[h]`` from the clean output, a change of rank d_head per head, so layer L+1's queries, keys and
    values move by ``z_h @ (W_O[h] @ W_QKV)`` (a product d_model / d_head times smaller than recomputing them);
    later layers get a full pass, and the last layer computes only the wanted queries. The same arithmetic as
    :class:`Ablator` (zeroing hook_z) in another order: equal up to float32 rounding (a few 1e-5 of a logit
    here), not bit-equal, so acceptance bounds computed with it need a guard band (``FAST_GUARD``), and the
    contract is checked with :class:`Ablator` (the tests do).
    """

    def __init__(self, model: HookedTransformer, tokens: torch.Tensor, queries: slice = slice(None)):
        if not model.cfg.attn_only:
            raise ValueError("QueryAblator needs an attention-only model")
        self.model, self.queries = model, queries
        self.qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.z: list[torch.Tensor] = []
        self.resid_post: list[torch.Tensor] = []
        self._composed: dict[tuple[int, int], torch.Tensor] = {}
        with torch.no_grad():
            resid = model.embed(tokens) + model.pos_embed(tokens)
            for block in model.blocks:
                attn = block.attn
                self.qkv.append(_qkv(attn, resid))
                self.z.append(_attend(attn, *self.qkv[-1], slice(None), []))
                resid = resid + torch.einsum("bqhe,hed->bqd", self.z[-1], attn.W_O) + attn.b_O
                self.resid_post.append(resid)

    def _composition(self, layer: int, head: int) -> torch.Tensor:
        """W_O of (layer, head) times the next layer's W_Q, W_K, W_V: [d_head, 3, heads, d_head]."""
        if (layer, head) not in self._composed:
            nxt = self.model.blocks[layer + 1].attn
            w_o = self.model.blocks[layer].attn.W_O[head]
            self._composed[layer, head] = torch.stack(
                [torch.einsum("ed,hdf->ehf", w_o, w) for w in (nxt.W_Q, nxt.W_K, nxt.W_V)], dim=1
            )
        return self._composed[layer, head]

    @property
    def clean(self) -> torch.Tensor:
        """Clean logits at the query positions, [batch, query, vocab]."""
        return self.logits([])

    def logits(self, heads: list[tuple[int, int]]) -> torch.Tensor:
        """Logits [batch, query, vocab] with ``heads`` zero-ablated at every position."""
        model, last, qs = self.model, self.model.cfg.n_layers - 1, self.queries
        by_layer: dict[int, list[int]] = {}
        for lay, h in sorted(set(heads)):
            if not (0 <= lay <= last and 0 <= h < model.cfg.n_heads):  # a negative index would count a head twice
                raise ValueError(f"no head ({lay}, {h}) in a {last + 1}-layer model of {model.cfg.n_heads} heads")
            by_layer.setdefault(lay, []).append(h)
        with torch.no_grad():
            if not heads:
                return model.unembed(self.resid_post[last][:, qs])
            start = min(by_layer)
            gone, w_o = by_layer[start], model.blocks[start].attn.W_O
            z_gone = self.z[start][:, :, gone]
            resid = self.resid_post[start] - torch.einsum("bpge,ged->bpd", z_gone, w_o[gone])
            if start == last:
                return model.unembed(resid[:, qs])
            delta = torch.einsum("bpge,gexhf->xbphf", z_gone, torch.stack([self._composition(start, h) for h in gone]))
            q, k, v = (clean - d for clean, d in zip(self.qkv[start + 1], delta, strict=True))
            for lay in range(start + 1, last + 1):
                attn, rows = model.blocks[lay].attn, qs if lay == last else slice(None)
                if lay > start + 1:
                    q, k, v = _qkv(attn, resid)
                z = _attend(attn, q[:, rows], k, v, rows, by_layer.get(lay, []))
                resid = resid[:, rows] + torch.einsum("bqhe,hed->bqd", z, attn.W_O) + attn.b_O
            return model.unembed(resid)


# ---------------------------------------------------------------------------------------
# generic head jobs (used for planted heads and for distractors alike)
# ---------------------------------------------------------------------------------------
def attend_offset(p: Planter, layer: int, head: int, offset: int, strength: float) -> None:
    """Attend from position i to position i - offset (offset 0: to itself)."""
    n = p.cfg.n_ctx
    pairs = [(p.lay.idx("pos", i), p.lay.idx("pos", i - offset), strength) for i in range(offset, n)]
    p.qk(layer, head, pairs)


def attend_flag(p: Planter, layer: int, head: int, key_dim: int, strength: float) -> None:
    """Attend from every position to keys carrying the residual dim ``key_dim`` (content based)."""
    p.qk(layer, head, [(p.lay.idx("const"), key_dim, strength)])


def attend_spread(
    p: Planter, layer: int, head: int, query: list[tuple[int, float]], key_dims: list[int], strength: float
) -> None:
    """A rank-1 QK in one free head dimension: the query reads the residual direction with the given (dim, weight)
    pairs, normalised, and the key the even mix of ``key_dims``; so the circuit's one singular value is
    ``strength`` (scaled as :meth:`Planter.qk`) whatever it reads, and a query x adds strength * (w . x) / (|w|
    sqrt(len(key_dims))) per key feature. Heads that read different numbers of features, or from different
    positions, so share one spectrum."""
    e = p.free_qk_dim(layer, head)
    root = np.sqrt(strength / np.sqrt(len(key_dims))) * np.sqrt(np.sqrt(p.cfg.d_head))
    norm = np.sqrt(sum(w * w for _, w in query))
    for q, w in query:
        p.W_Q[layer, head, q, e] += root * w / norm
    for k in key_dims:
        p.W_K[layer, head, k, e] += root


def copy_tokens(
    p: Planter, layer: int, head: int, tokens: list[int], dst: str, gain: float, dst_offsets: list[int] | None = None
) -> None:
    """OV: write the identity of each listed token into subspace ``dst`` (token t -> dst[t], or
    dst[offset] for scratch subspaces smaller than the vocabulary)."""
    pairs = []
    for i, t in enumerate(tokens):
        slot = t if dst_offsets is None else dst_offsets[i]
        pairs.append((p.lay.idx("tok", t), p.lay.idx(dst, slot), gain))
    p.ov(layer, head, pairs)


def copy_map(p: Planter, layer: int, head: int) -> dict[int, tuple[int, float]]:
    """A head's planted copy map (``Planter.ov`` pairs), read back: source residual dim -> (destination dim, gain).
    Used to plant a later head that composes with this one (its keys read exactly what this one writes)."""
    wv, wo = p.W_V[layer, head], p.W_O[layer, head]
    out = {}
    for e in range(wv.shape[1]):
        src = np.flatnonzero(wv[:, e])
        if len(src) == 1:
            dst = int(np.abs(wo[e]).argmax())
            out[int(src[0])] = (dst, float(wo[e, dst]))
    return out


def attend_same_token(p: Planter, layer: int, head: int, vocab: list[int], strength: float) -> None:
    """Duplicate-token job: attend to earlier (and the current) occurrences of the current token."""
    p.qk(layer, head, [(p.lay.idx("tok", t), p.lay.idx("tok", t), strength) for t in vocab])


def distractor_job(
    p: Planter,
    s: Stream,
    layer: int,
    head: int,
    vocab: list[int],
    flag_names: list[str],
    gain: tuple[float, float],
    strength: tuple[float, float],
    offsets: tuple[int, ...] = (0, 1, 2),
    n_tokens: tuple[int, int] = (6, 10),
    duplicate: bool = False,
    dst: str = "scr",
) -> str:
    """Give a head a real job unrelated to the answer: positional (self / previous / offset),
    content (a token-subset flag, the first position, duplicates of the current token or tokens paired
    with it by a fixed permutation), copying
    ``n_tokens`` tokens into scratch space (``dst``). Returns the job's name (for tests, never for the agent)."""
    kinds = [f"offset{o}" for o in offsets] + ["first"] + [f"flag:{f}" for f in flag_names]
    kinds += ["duplicate", "pairing"] if duplicate else []
    kind = s.pick(kinds)
    st = s.fraction(*strength)
    if kind.startswith("offset"):
        attend_offset(p, layer, head, int(kind[6:]), st)
    elif kind == "first":
        attend_flag(p, layer, head, p.lay.idx("pos", 0), st)
    elif kind == "duplicate":
        attend_same_token(p, layer, head, vocab, st)
    elif kind == "pairing":  # attend to tokens paired with the current one by a fixed permutation
        perm = s.permutation(len(vocab))
        p.qk(layer, head, [(p.lay.idx("tok", t), p.lay.idx("tok", vocab[perm[i]]), st) for i, t in enumerate(vocab)])
    else:
        attend_flag(p, layer, head, p.lay.idx(kind[5:]), st)
    k = s.between(*n_tokens)
    toks = [vocab[i] for i in s.sample(len(vocab), k)]
    copy_tokens(p, layer, head, toks, dst, s.fraction(*gain), s.sample(p.lay.dim(dst), k))
    return kind


def permute_heads(model: HookedTransformer, s: Stream) -> list[list[int]]:
    """Shuffle the heads of every layer (a relabelling: behaviour is unchanged) and return, per
    layer, the new index of each old head. Generators call this *after* their acceptance checks, so
    where the planted heads end up is uniform and independent of rejection sampling."""
    new_of: list[list[int]] = []
    with torch.no_grad():
        for block in model.blocks:
            src = s.permutation(model.cfg.n_heads)  # new head i is old head src[i]
            index = torch.tensor(src)
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
                param = getattr(block.attn, name)
                param.copy_(param[index].clone())
            new_of.append([src.index(h) for h in range(model.cfg.n_heads)])
    return new_of


def hooked_instance(
    task_id: str,
    version: str,
    seed: int,
    level: str,
    model: HookedTransformer,
    probe: dict,
    prompt: str,
    answer_schema: dict,
    roles: dict[tuple[int, int], str],
    kind: AnswerKind = AnswerKind.HEADS_ROLES,
    **extra_truth: object,
) -> Instance:
    """Assemble a transformer family's Instance; the truth is the planted heads and their roles."""
    cfg = model.cfg
    return Instance(
        task_id=task_id,
        level=level,
        seed=seed,
        family_version=version,
        model=model,
        probe=probe,
        config={"kind": "hooked-transformer", **cfg.to_dict()},
        prompt=prompt,
        answer_schema=answer_schema,
        truth={
            "kind": kind,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "heads": sorted([lay, h] for lay, h in roles),
            "roles": {f"L{lay}H{h}": role for (lay, h), role in roles.items()},
            **extra_truth,
        },
    )


def single_head_ablations(
    model: HookedTransformer,
    tokens: torch.Tensor,
    metric: Callable[[torch.Tensor], float],
    ablator: Ablator | QueryAblator | None = None,
) -> dict[tuple[int, int], float]:
    """``metric(logits)`` with each head zero-ablated alone, for every head (an :class:`Ablator` unless one is
    given: blocks before the head's layer come from the clean run; a :class:`QueryAblator` hands ``metric`` its
    query positions only). On CPU a single pass over a batch repeated per head measured slower than one pass per
    head, so there is no batching here."""
    ab = ablator or Ablator(model, tokens)
    return {
        (lay, h): metric(ab.logits([(lay, h)])) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)
    }


# ---------------------------------------------------------------------------------------
# spectral padding (opt-in): every head of a layer gets the same QK and OV singular values
# ---------------------------------------------------------------------------------------
def spectral_target(s: Stream, bound: float, n: int, spread: tuple[float, float] = (1.02, 1.2)) -> np.ndarray:
    """A sorted (descending) profile of ``n`` singular values, each in ``bound`` * ``spread``: draw it
    once per layer from constants of the level (never from the planted heads), so it says nothing
    about which jobs the layer holds."""
    return bound * np.sort([s.fraction(*spread) for _ in range(n)])[::-1]


def canonical_svd(left: np.ndarray, right: np.ndarray, rel_tol: float = 1e-9) -> tuple[np.ndarray, ...]:
    """(u [d, r], sigma [r], v [d, r]): the SVD of left @ right.T (thin factors [d, k]) at its numerical rank r, in a
    basis that LAPACK does not choose. Why: a planted circuit's singular values are often equal (every pair of a head
    at one strength), and where they are, LAPACK may return any basis of their subspace and any sign; a weight built
    from those vectors then differs between machines (OpenBLAS on one CPU, another on the next), the noise of a hard
    level lands on other weights, a score near an acceptance margin moves and the accepted draw -- the truth --
    differed (head-roles 4, hard seed 7, 2026-12-04). Here every cluster of equal singular values (within
    ``rel_tol``) gets the orthonormalised projection of a fixed generic matrix onto its left subspace (a subspace is
    unique up to rounding), with positive R diagonal, and v follows from u: the same vectors everywhere, to rounding."""
    (ql, rl), rr = np.linalg.qr(left), np.linalg.qr(right)[1]  # the SVD of left @ right.T, in k dims
    us, sig, _ = np.linalg.svd(rl @ rr.T)
    rank = int((sig > rel_tol * max(float(sig[0]), 1e-300)).sum()) if len(sig) else 0
    found, sig = ql @ us[:, :rank], sig[:rank]
    u = np.empty_like(found)
    start = 0
    while start < rank:
        stop = start + 1
        while stop < rank and sig[start] - sig[stop] <= rel_tol * sig[start]:
            stop += 1
        block = found[:, start:stop]
        rows, cols = np.meshgrid(np.arange(block.shape[0]), np.arange(stop - start), indexing="ij")
        generic = np.cos((rows + 1.0) * (cols + 1.5) * 0.7548776662466927)  # fixed, no two columns alike
        q, r = np.linalg.qr(block @ (block.T @ generic))
        u[:, start:stop] = q * np.sign(np.diag(r))[None, :]
        start = stop
    return u, sig, right @ (left.T @ u) / sig


def pad_spectrum(p: Planter, s: Stream, layer: int, head: int, circuit: str, target: np.ndarray, pad: str,
                 sink: str | None = None, traceless: bool = False) -> None:  # fmt: skip
    """Rewrite one head's QK (``circuit="qk"``: W_Q W_K^T) or OV (``"ov"``: W_V W_O) so that its
    singular values are exactly ``target`` (sorted descending, one per head dimension) while every
    entry between dims outside ``pad`` / ``sink`` keeps its planted value -- so the head computes the same.

    How: with the planted matrix A = sum_i sigma_i u_i v_i^T, the head gets
    sum_i target_i a_i b_i^T, where a_i = c_i u_i + sqrt(1 - c_i^2) e_{p_i} and
    b_i = c_i v_i + sqrt(1 - c_i^2) e_{q_i}, c_i = sqrt(sigma_i / target_i) (0 beyond A's rank), and
    p_i, q_i distinct dims of ``pad`` (QK: both sides read it; OV: the source side reads it) or of
    ``sink`` (OV: the destination side writes it). ``pad`` must be a subspace nothing writes and
    ``sink`` one nothing reads; the caller guarantees that. Needs target_i >= sigma_i (ValueError
    otherwise) and ``pad`` / ``sink`` of at least d_head dims. ``traceless`` (QK): no direction pairs a pad dim
    with itself (p_i != q_i), so the pad adds nothing to the trace (head-roles 3 keeps every role's trace zero)."""
    dh = p.cfg.d_head
    if circuit == "qk":
        left, right = p.W_Q[layer, head], p.W_K[layer, head]
        side = (pad, pad)
    elif circuit == "ov":
        left, right = p.W_V[layer, head], p.W_O[layer, head].T
        side = (pad, sink or pad)
    else:
        raise ValueError(circuit)
    u, sig, v = canonical_svd(left, right)
    target = np.asarray(target, dtype=float)
    rank = len(sig)
    if rank > dh or len(target) != dh or np.any(target[:rank] < sig * (1 + 1e-9)):
        raise ValueError(f"target profile below the planted one (L{layer}H{head} {circuit})")
    new, picked = [], []
    for (start, stop), vecs in zip((p.lay.spans[side[0]], p.lay.spans[side[1]]), (u.T, v.T), strict=True):
        if stop - start < dh:
            raise ValueError("pad / sink subspaces need d_head dims")
        if rank and np.abs(vecs[:rank, start:stop]).max() > 1e-9:
            raise ValueError("the planted circuit already touches the pad / sink subspace")
        dims = [start + i for i in s.sample(stop - start, dh)]
        while traceless and picked and any(a == b for a, b in zip(picked[0], dims, strict=True)):
            dims = [start + i for i in s.sample(stop - start, dh)]
        picked.append(dims)
        cols = np.zeros((p.cfg.d_model, dh))
        for i in range(dh):
            c = np.sqrt(sig[i] / target[i]) if i < rank else 0.0  # both sides lean in equally: the least noise
            if i < rank:
                cols[:, i] = c * vecs[i]
            cols[dims[i], i] += np.sqrt(1.0 - c * c)
        new.append(cols * np.sqrt(target))
    if circuit == "qk":
        p.W_Q[layer, head], p.W_K[layer, head] = new
    else:
        p.W_V[layer, head], p.W_O[layer, head] = new[0], new[1].T
