"""Circuit discovery by ablation as a Gymnasium environment (issue 23): ``MechSandbox/HeadDiscovery-v0``.

The MechRL setting (a policy picks attention heads one at a time, each pick zero-ablates that head and pays a
contrastive reward) on MechSandbox's transformer families, whose circuits are known exactly, so a policy's picks
are scored against the truth rather than against literature head lists. Importing ``mechsandbox.gym`` registers
the id (optional extra ``[gym]``: gymnasium)::

    import gymnasium, mechsandbox.gym
    env = gymnasium.make("MechSandbox/HeadDiscovery-v0", tasks=["copy-head", "committee-circuit"], level="easy")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(int(info["action_mask"].argmax()))

**An episode.** ``reset`` draws a family (``options={"task": ...}`` or uniformly from ``tasks``) and a fresh
instance of it from the seed, generated in process (no server). Each step picks one head (``Discrete(A)`` over one
grid for every family: action ``layer * H + head``, ``H`` the most heads per layer and ``A`` the most layers times
``H`` among the tasks at that level, so an index names the same layer in every family; heads the instance does not
have are masked);
the head joins the ablated set ``S`` (heads stay ablated: zeroed ``hook_z``, the family's own probe batch).

**The reward** of picking ``h`` with ``S`` already ablated is ``effect - control``:

- ``effect = max(d(h | {}), d(h | S))``, where ``d(h | S) = (m(S) - m(S + h)) / m({})`` and ``m`` is the family's
  behaviour metric on its probe (the mean logit margin of the right token: the last position for copy-head and
  committee-circuit, the repeated half for induction-circuit). The first term finds heads of a serial circuit
  (once the induction head is ablated, the previous-token head changes nothing more, but alone it breaks the
  behaviour); the second finds redundant ones (committee-circuit's backups show only once their primaries are
  ablated). Either alone misses one kind.
- ``control``: how much more the ablation disturbs a control batch (random tokens of the probe's shape, drawn
  from the instance seed) than before the pick: the mean KL divergence of the clean next-token distributions to
  the ablated ones, times ``control_weight``. A head that breaks everything is not a circuit head.

A repeated pick, or a head the instance does not have, costs ``repeat_penalty`` and runs no forward pass. The
episode terminates after ``budget`` picks (default: the size of the instance's true head set, as the benchmark's
audit is told the answer size; the observation's ``budget_left`` and ``info["budget_left"]`` count down) or when
every head was tried; a step after the end raises ``ResetNeeded``. It never truncates.

Why the budget's end is a termination, not a truncation: the budget is part of the task (name the circuit in that
many picks; the return and the precision are complete at the last pick), so nothing follows it and a learner must
not bootstrap past it, which is what ``terminated`` tells one. A truncation is a time limit outside the task, after
which a learner bootstraps (sb3's do). As a truncation, a one-head circuit (copy-head's) ended every episode with a
"truncation" after its first step, which Gymnasium's ``check_env`` rejects. ``budget_left`` is in the observation so
that the termination is a function of what the policy sees.

**What a policy can learn.** Heads are permuted within each layer per instance. With the MechRL observation (the
default) nothing about a head is seen before it is tried, so at the default budget a policy can learn only where
circuits sit (which layers) and not to waste picks: its precision exceeds a random masked policy's only by that
layer prior. ``head_features=True`` adds what an interpretability agent looks at first, every head's attention
statistics and output size on the probe (``HEAD_FEATURES``, one forward pass per instance), and a policy then
learns which statistics make an ablation worth spending (examples/ppo_head_discovery.py; docs/TASKS.md, "Head
discovery").

**Observation** (``Dict``; ``flatten=True`` gives one ``Box``): ``task`` (one-hot over ``tasks``), ``tried`` (0/1
per action), ``scores`` (the reward each tried head paid, 0 otherwise), ``valid`` (0/1: the instance has that head),
``budget_left`` (the picks left, one number) and, with ``head_features=True``, ``features`` ([action,
len(HEAD_FEATURES)] in [0, 1]; zero for absent heads). ``action_masks()`` (what sb3-contrib's MaskablePPO reads) and
``info["action_mask"]``: valid and untried. ``info`` also has ``picks``, ``best`` (the largest reward so far),
``budget_left``, ``metric_lost`` (``(m({}) - m(S)) / m({})``) and, when the episode ends, ``precision``, ``recall``
and ``jaccard`` of the picks against the true heads.

**Cost.** A step runs at most two ablations of the probe batch and two of the control batch (each from the earliest
ablated layer: the clean residual stream is cached; sets already measured are cached); bench/gym_env.py prints
the time per step and per reset (a reset generates an instance: 0.1-1.5 s; docs/TASKS.md, "Head discovery").
Constructing an env sets torch to one intra-op thread unless the user chose a count (``torch_threads.py``: the
models are small, and torch's default of a thread per core crawls on a busy machine).

:func:`greedy_oracle` is the exact-oracle baseline: it picks, ``budget`` times, the head with the largest effect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch

try:
    import gymnasium
    from gymnasium import spaces
except ImportError as exc:  # the optional extra
    raise ImportError("mechsandbox.gym needs gymnasium: pip install 'mechsandbox[gym]'") from exc

from .tasks import LEVELS, generate, get_family
from .tasks.base import Instance
from .tasks.circuits import Ablator, margin
from .torch_threads import configure_torch_threads

ENV_ID = "MechSandbox/HeadDiscovery-v0"
HEAD_SET_FAMILIES = ("copy-head", "induction-circuit", "committee-circuit")
"""Transformer families whose truth is a set of heads with a behaviour metric (head-roles' roles are attention
patterns with no behaviour to lose, so it is not one of them)."""

Head = tuple[int, int]


def _behaviour(instance: Instance) -> tuple[torch.Tensor, Callable[[torch.Tensor], float]]:
    """The probe tokens and the family's metric of the model's logits on them."""
    tokens = instance.probe["tokens"]
    if instance.task_id == "induction-circuit":
        half = tokens.shape[1] // 2
        return tokens, lambda logits: margin(logits[:, half:-1], tokens[:, half + 1 :]).mean().item()
    targets = instance.probe["targets"]
    return tokens, lambda logits: margin(logits[:, -1], targets).mean().item()


HEAD_FEATURES = ("attn_prev", "attn_first", "attn_same_token", "attn_after_same_token", "attn_entropy", "out_norm")
"""What ``head_features=True`` observes of every head before it is tried, from one clean forward pass on the probe:
the mean attention on the previous position, on position 0, on earlier copies of the query's token and on the
tokens after them (TransformerLens ``detect_head``-style scores), the attention's entropy as a fraction of its
maximum, and the mean norm of what the head writes (over the largest head's)."""


@torch.no_grad()  # a graph through W_O would keep every cached activation alive with the result
def head_features(model: Any, tokens: torch.Tensor) -> np.ndarray:
    """[n_layers, n_heads, len(HEAD_FEATURES)] attention statistics of every head on ``tokens`` (see HEAD_FEATURES).

    Why these: they are what an interpretability agent looks at first (attention patterns and output sizes), they
    are cheap (one forward pass per instance), and they do not name a circuit by themselves: decoy heads share
    attention rules with circuit heads by construction, so a policy learns which statistics make an ablation worth
    trying, not where the answer is."""
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_z")))
    n = tokens.shape[1]
    pos = torch.arange(n)
    earlier = pos[:, None] > pos[None, :]  # [query, key]: strictly earlier keys
    same = (tokens[:, :, None] == tokens[:, None, :]) & earlier  # an earlier copy of the query's token
    after = torch.zeros_like(same)  # key j <= query with token j - 1 the query's: the token after an earlier copy
    after[:, :, 1:] = (tokens[:, :, None] == tokens[:, None, :-1]) & (pos[:, None] >= pos[None, 1:])[None]
    max_entropy = torch.log(pos[1:].double() + 1)  # query q attends over q + 1 keys
    rows = []
    for layer in range(model.cfg.n_layers):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [batch, head, query, key]
        entropy = -(pat * pat.clamp_min(1e-30).log()).sum(-1)[:, :, 1:] / max_entropy
        z = cache[f"blocks.{layer}.attn.hook_z"].double()  # [batch, query, head, d_head]
        written = torch.einsum("bqhe,hed->bqhd", z, model.W_O[layer].double()).norm(dim=-1).mean((0, 1))
        rows.append(torch.stack([
            pat[:, :, pos[1:], pos[1:] - 1].mean((0, 2)),
            pat[:, :, 1:, 0].mean((0, 2)),
            (pat * same[:, None]).sum(-1).mean((0, 2)),
            (pat * after[:, None]).sum(-1).mean((0, 2)),
            entropy.mean((0, 2)),
            written,
        ], dim=-1))  # fmt: skip
    feats = torch.stack(rows)
    feats[..., -1] /= feats[..., -1].max().clamp_min(1e-30)
    return feats.float().numpy()


@dataclass
class Probe:
    """One instance's ablation oracle: the behaviour metric and the control disturbance of any ablated set."""

    instance: Instance

    def __post_init__(self) -> None:
        model = self.instance.model
        tokens, self.metric = _behaviour(self.instance)
        self.task = Ablator(model, tokens)
        gen = torch.Generator().manual_seed(int(self.instance.seed) % 2**63)
        control = torch.randint(0, model.cfg.d_vocab, tuple(tokens.shape), generator=gen)
        self.control = Ablator(model, control)
        self.clean_log_probs = self.control.clean.log_softmax(-1)
        self.clean = self.metric(self.task.clean)
        self.heads = [(lay, h) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
        self.truth = {(int(lay), int(h)) for lay, h in self.instance.truth["heads"]}
        self._metric: dict[frozenset[Head], float] = {frozenset(): self.clean}
        self._control: dict[frozenset[Head], float] = {frozenset(): 0.0}

    @cached_property
    def features(self) -> np.ndarray:
        """:func:`head_features` on the probe, computed on first use (only ``head_features=True`` episodes ask)."""
        return head_features(self.instance.model, self.instance.probe["tokens"])

    def forget_sets(self) -> None:
        """Drop the cached ablations of head sets (kept: the clean run and each head alone), so an instance kept
        for many episodes holds memory in proportion to its heads, not to every set ever tried."""
        for cache in (self._metric, self._control):
            for key in [k for k in cache if len(k) > 1]:
                del cache[key]

    def metric_with(self, heads: Sequence[Head]) -> float:
        """The behaviour metric with ``heads`` ablated together (cached per set)."""
        key = frozenset(heads)
        if key not in self._metric:
            with torch.no_grad():
                self._metric[key] = self.metric(self.task.logits(sorted(key)))
        return self._metric[key]

    def control_with(self, heads: Sequence[Head]) -> float:
        """The mean KL divergence of the clean next-token distributions on the control batch to the ablated ones."""
        key = frozenset(heads)
        if key not in self._control:
            with torch.no_grad():
                ablated = self.control.logits(sorted(key)).log_softmax(-1)
                clean = self.clean_log_probs
                self._control[key] = (clean.exp() * (clean - ablated)).sum(-1).mean().item()
        return self._control[key]

    def gain(self, head: Head, ablated: Sequence[Head]) -> tuple[float, bool]:
        """``max(d(head | {}), d(head | ablated))`` and whether the single ablation gave it."""
        scale = max(abs(self.clean), 1e-6)
        single = (self.clean - self.metric_with([head])) / scale
        marginal = (self.metric_with(ablated) - self.metric_with([*ablated, head])) / scale
        return (single, True) if single >= marginal else (marginal, False)

    def effect(self, head: Head, ablated: Sequence[Head]) -> tuple[float, float]:
        """(effect, control increase) of adding ``head`` to ``ablated`` (see the module docstring); the control
        increase is the one of the ablation that gave the effect."""
        effect, single = self.gain(head, ablated)
        if single:
            return effect, self.control_with([head])
        return effect, self.control_with([*ablated, head]) - self.control_with(ablated)


def greedy_oracle(instance: Instance, budget: int | None = None) -> list[Head]:
    """The exact-oracle baseline: ``budget`` picks (default the true set's size), each the head with the largest
    effect given the heads picked so far (kept ablated), so serial heads (found alone) and backups (found once
    their primaries are ablated) are both reached."""
    probe = Probe(instance)
    picks: list[Head] = []
    for _ in range(budget if budget is not None else len(probe.truth)):
        rest = [h for h in probe.heads if h not in picks]
        if not rest:
            break
        picks.append(max(rest, key=lambda h: probe.gain(h, picks)[0]))
    return picks


def pick_scores(picks: Sequence[Head], truth: set[Head]) -> dict[str, float]:
    """Precision, recall and Jaccard of a set of picks against the true heads."""
    chosen = set(picks)
    hit = len(chosen & truth)
    return {"precision": hit / len(chosen) if chosen else 0.0, "recall": hit / len(truth) if truth else 1.0,
            "jaccard": hit / len(chosen | truth) if chosen | truth else 1.0}  # fmt: skip


class HeadDiscoveryEnv(gymnasium.Env):
    """``MechSandbox/HeadDiscovery-v0`` (the module docstring describes it)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, tasks: Sequence[str] | None = None, level: str = "easy", budget: int | None = None,
                 control_weight: float = 1.0, repeat_penalty: float = 0.1, flatten: bool = False,
                 sample_tasks: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
                 head_features: bool = False):  # fmt: skip
        """``tasks``: the families the spaces cover (the one-hot's order); ``sample_tasks``: those a reset without
        ``options["task"]`` draws from (default all of ``tasks``; fewer keeps a family held out for transfer with
        the same spaces); ``seeds``: draw instance seeds from this list and keep each instance once generated (a
        training set; default a fresh seed per reset, nothing kept); ``head_features``: add ``features``, every
        head's attention statistics before it is tried (HEAD_FEATURES; off: the MechRL observation)."""
        configure_torch_threads()
        self.tasks = tuple(tasks) if tasks else HEAD_SET_FAMILIES
        self.sample_tasks = tuple(sample_tasks) if sample_tasks else self.tasks
        unknown = [t for t in (*self.tasks, *self.sample_tasks) if t not in HEAD_SET_FAMILIES]
        if unknown:
            raise ValueError(f"not a head-set family: {unknown}; choose from {list(HEAD_SET_FAMILIES)}")
        if not set(self.sample_tasks) <= set(self.tasks):
            raise ValueError("sample_tasks must be among tasks")
        if seeds is not None and not len(seeds):
            raise ValueError("seeds must not be empty")
        self.seeds = tuple(int(s) for s in seeds) if seeds is not None else None
        self._kept: dict[tuple[str, int], Probe] = {}
        if level not in LEVELS:
            raise ValueError(f"level must be one of {list(LEVELS)}")
        if budget is not None and budget < 1:
            raise ValueError("budget must be at least 1")
        self.level, self.budget_override = level, budget
        self.control_weight, self.repeat_penalty, self.flatten = control_weight, repeat_penalty, flatten
        schemas = [get_family(t).answer_schema_fn(level) for t in self.tasks]
        # one grid for every family: action layer * max_heads + head, so an index means the same layer everywhere
        self.max_heads = max(sc["x-n-heads"] for sc in schemas)
        self.n_actions = max(sc["x-n-layers"] for sc in schemas) * self.max_heads
        n = self.n_actions
        self.head_features = head_features
        parts = {
            "task": spaces.Box(0.0, 1.0, (len(self.tasks),), np.float32),
            "tried": spaces.Box(0.0, 1.0, (n,), np.float32),
            "scores": spaces.Box(-np.inf, np.inf, (n,), np.float32),
            "valid": spaces.Box(0.0, 1.0, (n,), np.float32),
            # the default budget (the true set's size) is at most the number of heads, so at most n
            "budget_left": spaces.Box(0.0, float(max(budget or 0, n)), (1,), np.float32),
        }
        if head_features:
            parts["features"] = spaces.Box(0.0, 1.0, (n, len(HEAD_FEATURES)), np.float32)
        self.dict_space = spaces.Dict(parts)
        self.observation_space = spaces.flatten_space(self.dict_space) if flatten else self.dict_space
        self.action_space = spaces.Discrete(n)
        self.probe: Probe | None = None

    # --- episode --------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        # two raw draws whatever the options say, so a seed gives the same instance seed with or without a task
        task_draw, seed_draw = (int(self.np_random.bit_generator.random_raw()) for _ in range(2))
        task = (options or {}).get("task")
        if task is None:
            task = self.sample_tasks[task_draw % len(self.sample_tasks)]
        elif task not in self.tasks:
            raise ValueError(f"options['task'] must be one of {list(self.tasks)}")
        if self.seeds is None:
            self.probe = Probe(generate(task, seed_draw % (2**31 - 1), self.level))
        else:
            key = (task, self.seeds[seed_draw % len(self.seeds)])
            if key not in self._kept:
                self._kept[key] = Probe(generate(task, key[1], self.level))
            self.probe = self._kept[key]
            self.probe.forget_sets()  # the heads' own ablations stay cached, the last episode's sets go
        self.task = task
        self.head_of = {lay * self.max_heads + h: (lay, h) for lay, h in self.probe.heads}
        self.budget = self.budget_override or len(self.probe.truth)
        self.tried = np.zeros(self.n_actions, np.float32)
        self.scores = np.zeros(self.n_actions, np.float32)
        self.valid = np.zeros(self.n_actions, np.float32)
        self.valid[list(self.head_of)] = 1.0
        if self.head_features:  # constant through the episode: laid on the action grid once
            self.features = np.zeros((self.n_actions, len(HEAD_FEATURES)), np.float32)
            for action, (lay, h) in self.head_of.items():
                self.features[action] = self.probe.features[lay, h]
        self.picks: list[Head] = []
        self.steps = 0
        self.rewards: list[float] = []
        self.over = False
        return self._observation(), self._info(done=False)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self.probe is None or self.over:
            raise gymnasium.error.ResetNeeded("call reset() before step() (the episode is over)")
        if not self.action_space.contains(action):
            raise AssertionError(f"{action!r} ({type(action).__name__}) is not in {self.action_space}")
        action = int(action)
        self.steps += 1
        head = self.head_of.get(action)
        if head is None or self.tried[action]:
            reward = -self.repeat_penalty  # no forward pass
            self.tried[action] = 1.0 if head is not None else self.tried[action]
        else:
            effect, control = self.probe.effect(head, self.picks)
            reward = effect - self.control_weight * control
            self.picks.append(head)
            self.tried[action], self.scores[action] = 1.0, reward
        self.rewards.append(float(reward))
        # the budget belongs to the task (module docstring): its end is a termination, and nothing truncates
        terminated = self.steps >= self.budget or len(self.picks) == len(self.head_of)
        self.over = terminated
        return self._observation(), float(reward), terminated, False, self._info(terminated)

    def action_masks(self) -> np.ndarray:
        """Valid, untried heads (sb3-contrib's MaskablePPO calls this)."""
        return (self.valid > 0) & (self.tried == 0)

    # --- views ----------------------------------------------------------------------------------

    def _observation(self) -> Any:
        one_hot = np.zeros(len(self.tasks), np.float32)
        one_hot[self.tasks.index(self.task)] = 1.0
        obs = {"task": one_hot, "tried": self.tried.copy(), "scores": self.scores.copy(), "valid": self.valid.copy(),
               "budget_left": np.array([self.budget - self.steps], np.float32)}  # fmt: skip
        if self.head_features:
            obs["features"] = self.features.copy()
        return spaces.flatten(self.dict_space, obs) if self.flatten else obs

    def _info(self, done: bool) -> dict[str, Any]:
        assert self.probe is not None
        metric = self.probe.metric_with(self.picks)
        info: dict[str, Any] = {"task": self.task, "seed": self.probe.instance.seed, "action_mask": self.action_masks(),
                                "picks": list(self.picks), "best": max(self.rewards, default=None),
                                "budget_left": self.budget - self.steps,
                                "metric_lost": (self.probe.clean - metric) / max(abs(self.probe.clean), 1e-6),
                                }  # fmt: skip
        if done:
            info.update(pick_scores(self.picks, self.probe.truth), truth_size=len(self.probe.truth))
        return info


def register() -> None:
    """Register ``MechSandbox/HeadDiscovery-v0`` with Gymnasium (done on import; safe to call again)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="mechsandbox.gym:HeadDiscoveryEnv")


register()
