"""A masked PPO (CleanRL-style, plain torch) on ``MechSandbox/HeadDiscovery-v0`` (issue 23), compared on held-out
seeds with a uniformly random masked policy and the exact greedy oracle.

    python examples/ppo_head_discovery.py [--updates 40] [--level easy] [--steps 32] [--train-seeds 64]

Trained on copy-head and induction-circuit instances from a fixed set of training seeds (each generated once),
evaluated on fresh seeds of those families and on committee-circuit, held out (the MechRL transfer setting: the
spaces cover all three families, the policy never saw the third). Prints the learning curve (mean return per
update) and, per evaluation family, the mean return and the precision / recall of the picks against the exact
truth for the trained policy, the random policy and the oracle. A few minutes on 2 CPU cores. It prints its setup
at once and a line per update with the time so far, so a slow machine shows as slow progress, not as silence.
Torch runs on one intra-op thread unless ``OMP_NUM_THREADS`` says otherwise, as the Gym env sets it
(``mechsandbox.torch_threads``: the models are small, and a thread per core crawls on a busy machine).

The environment runs with ``head_features=True``: before a head is tried the policy sees its attention statistics
and output size on the probe (``mechsandbox.gym.HEAD_FEATURES``), what an interpretability agent looks at first.
Heads are permuted per instance, so no index is ever the answer; the agent scores every head with one shared
network and learns which statistics make an ablation worth spending, which also carries over to the held-out
family. Without the features (the MechRL observation) the most a policy can learn is a layer prior, an edge that
20 evaluation episodes do not resolve (docs/TASKS.md, "Head discovery"). The oracle, which ablates every candidate,
is the ceiling.
"""

from __future__ import annotations

import argparse
import time

import gymnasium
import numpy as np
import torch
from mechsandbox.gym import HEAD_FEATURES, HeadDiscoveryEnv, greedy_oracle
from mechsandbox.torch_threads import configure_torch_threads
from torch import nn

TASKS = ("copy-head", "induction-circuit", "committee-circuit")
TRAIN, HELD_OUT = ("copy-head", "induction-circuit"), "committee-circuit"


class Agent(nn.Module):
    """One small network shared by every head: a head's logit from its own inputs (its attention statistics, tried,
    score, layer) and a summary of all heads and the task; the value from that summary. Shared weights make the
    policy treat heads alike wherever the instance put them (heads are permuted per seed), so what it learns about
    one head's statistics carries over to every index."""

    def __init__(self, n_tasks: int, n_layers: int, n_features: int, hidden: int = 64):
        super().__init__()
        self.n_layers = n_layers
        self.head = nn.Sequential(nn.Linear(n_features + 3 + n_layers + n_tasks, hidden), nn.Tanh(),
                                  nn.Linear(hidden, hidden), nn.Tanh())  # fmt: skip
        self.pi = nn.Linear(2 * hidden, 1)
        self.v = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def _encode(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        feats = obs["features"]  # [batch, actions, features]
        batch, n_actions = feats.shape[:2]
        layer = torch.arange(n_actions) // (n_actions // self.n_layers)
        per_head = torch.cat([feats, obs["tried"][..., None], obs["scores"][..., None], obs["valid"][..., None],
                              nn.functional.one_hot(layer, self.n_layers).float().expand(batch, -1, -1),
                              obs["task"][:, None].expand(-1, n_actions, -1)], dim=-1)  # fmt: skip
        h = self.head(per_head)
        valid = obs["valid"][..., None]
        pooled = (h * valid).sum(1) / valid.sum(1).clamp_min(1.0)
        return h, pooled

    def dist(self, obs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.distributions.Categorical:
        h, pooled = self._encode(obs)
        logits = self.pi(torch.cat([h, pooled[:, None].expand_as(h)], -1)).squeeze(-1).masked_fill(~mask, -1e9)
        return torch.distributions.Categorical(logits=logits)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.v(self._encode(obs)[1]).squeeze(-1)


def as_tensors(obs: dict[str, np.ndarray], batched: bool = True) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v if batched else v[None], dtype=torch.float32) for k, v in obs.items()}


def make_env(level: str, seeds: list[int] | None, sample: tuple[str, ...]) -> HeadDiscoveryEnv:
    return HeadDiscoveryEnv(tasks=TASKS, level=level, seeds=seeds, sample_tasks=sample, head_features=True)


def train(level: str, updates: int, n_envs: int = 4, n_steps: int = 32, seed: int = 0, train_seeds: int = 64,
          log: bool = True) -> tuple[Agent, list[float]]:  # fmt: skip
    """PPO with action masks: ``updates`` rollouts of ``n_envs * n_steps`` steps, 4 epochs each, on instances of
    seeds ``0 .. train_seeds - 1`` (held-out evaluation uses seeds from 10,000)."""
    torch.manual_seed(seed)
    started = time.perf_counter()
    seeds = list(range(train_seeds))
    envs = gymnasium.vector.SyncVectorEnv([lambda: make_env(level, seeds, TRAIN) for _ in range(n_envs)],
                                         autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)  # fmt: skip
    n_actions = int(envs.single_action_space.n)
    first = envs.envs[0].unwrapped
    agent = Agent(len(TASKS), n_actions // first.max_heads, len(HEAD_FEATURES))
    optim = torch.optim.Adam(agent.parameters(), lr=3e-3)
    obs, info = envs.reset(seed=seed)
    mask = np.stack(info["action_mask"])
    curve: list[float] = []
    for update in range(updates):
        buf = {k: [] for k in ("obs", "mask", "act", "logp", "rew", "done", "val")}
        returns, running = [], np.zeros(n_envs)
        for _ in range(n_steps):
            o, m = as_tensors(obs), torch.as_tensor(mask)
            with torch.no_grad():
                d = agent.dist(o, m)
                act = d.sample()
                buf["logp"].append(d.log_prob(act))
                buf["val"].append(agent.value(o))
            buf["obs"].append(o)
            buf["mask"].append(m)
            buf["act"].append(act)
            obs, rew, term, trunc, info = envs.step(act.numpy())
            done = term | trunc
            running += rew
            returns += running[done].tolist()
            running[done] = 0.0
            buf["rew"].append(torch.as_tensor(rew, dtype=torch.float32))
            buf["done"].append(torch.as_tensor(done, dtype=torch.float32))
            mask = np.stack(info["action_mask"])
        with torch.no_grad():
            next_v = agent.value(as_tensors(obs))
        adv, last = torch.zeros(n_steps, n_envs), torch.zeros(n_envs)
        for t in reversed(range(n_steps)):  # GAE; an episode's end cuts the bootstrap
            v_next = next_v if t == n_steps - 1 else buf["val"][t + 1]
            nonterminal = 1.0 - buf["done"][t]
            delta = buf["rew"][t] + 0.99 * v_next * nonterminal - buf["val"][t]
            last = delta + 0.99 * 0.95 * nonterminal * last
            adv[t] = last
        flat = {k: torch.stack(v).flatten(0, 1) for k, v in buf.items() if k not in ("rew", "done", "obs")}
        flat_obs = {k: torch.stack([o[k] for o in buf["obs"]]).flatten(0, 1) for k in buf["obs"][0]}
        adv = adv.flatten()
        ret = adv + flat["val"]
        for _ in range(4):
            for idx in torch.randperm(len(adv)).split(32):
                batch = {k: v[idx] for k, v in flat_obs.items()}
                d = agent.dist(batch, flat["mask"][idx])
                ratio = (d.log_prob(flat["act"][idx]) - flat["logp"][idx]).exp()
                a = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
                pg = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
                loss = pg + 0.5 * ((agent.value(batch) - ret[idx]) ** 2).mean() - 0.01 * d.entropy().mean()
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optim.step()
        curve.append(float(np.mean(returns)) if returns else float("nan"))
        if log:
            print(f"update {update + 1:3d}: mean return {curve[-1]:+.3f} over {len(returns):3d} episodes "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    envs.close()
    return agent, curve


def evaluate(policy: str, agent: Agent | None, level: str, task: str, seeds: list[int]) -> dict[str, float]:
    """Mean return, precision and recall on fresh instances (``seeds`` seed each env's draw)."""
    env = make_env(level, None, (task,))
    rng = np.random.default_rng(0)
    rows = []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        if policy == "oracle":
            picks = greedy_oracle(env.probe.instance, env.budget)
            actions = [lay * env.max_heads + h for lay, h in picks]
        total, done, k = 0.0, False, 0
        while not done:
            mask = info["action_mask"]
            if policy == "oracle":
                action = actions[k]
            elif policy == "random":
                action = int(rng.choice(np.flatnonzero(mask)))
            else:
                with torch.no_grad():
                    logits = agent.dist(as_tensors(obs, batched=False), torch.as_tensor(mask)[None])
                action = int(logits.probs.argmax())
            obs, reward, term, trunc, info = env.step(action)
            total, done, k = total + reward, term or trunc, k + 1
        rows.append((total, info["precision"], info["recall"]))
    env.close()
    return dict(zip(("return", "precision", "recall"), np.mean(rows, axis=0).tolist(), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--level", default="easy")
    ap.add_argument("--eval-seeds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=32, help="steps per env per update (4 envs)")
    ap.add_argument("--train-seeds", type=int, default=64, help="training instances per family: seeds 0..n-1")
    args = ap.parse_args()
    threads = configure_torch_threads()
    print(f"ppo_head_discovery: {args.updates} updates of 4 x {args.steps} steps on {args.train_seeds} seeds of "
          f"{', '.join(TRAIN)} ({args.level}), torch on {threads} thread{'s' * (threads != 1)}; each new training "
          "instance is generated on first use", flush=True)  # fmt: skip
    started = time.perf_counter()
    agent, _ = train(args.level, args.updates, n_steps=args.steps, train_seeds=args.train_seeds)
    print(f"trained in {time.perf_counter() - started:.0f} s; evaluating on {args.eval_seeds} held-out seeds per "
          "family", flush=True)  # fmt: skip
    held_out_seeds = [10_000 + i for i in range(args.eval_seeds)]
    print(f"\n{'family':20} {'policy':8} {'return':>8} {'precision':>9} {'recall':>7}   (held-out seeds)")
    for task in (*TRAIN, HELD_OUT):
        for policy in ("ppo", "random", "oracle"):
            row = evaluate(policy, agent, args.level, task, held_out_seeds)
            name = f"{task}{' (held out)' if task == HELD_OUT else ''}"
            cells = f"{row['return']:+8.3f} {row['precision']:9.2f} {row['recall']:7.2f}"
            print(f"{name:20} {policy:8} {cells}", flush=True)


if __name__ == "__main__":
    main()
