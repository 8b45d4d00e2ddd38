"""A masked PPO (CleanRL-style, plain torch) on ``MechSandbox/HeadDiscovery-v0`` (issue 23), compared on held-out
seeds with a uniformly random masked policy and the exact greedy oracle.

    python examples/ppo_head_discovery.py [--updates 40] [--level easy]

Trained on copy-head and induction-circuit instances from a fixed set of training seeds (each generated once),
evaluated on fresh seeds of those families and on committee-circuit, held out (the MechRL transfer setting: the
spaces cover all three families, the policy never saw the third). Prints the learning curve (mean return per
update) and, per evaluation family, the mean return and the precision / recall of the picks against the exact
truth for the trained policy, the random policy and the oracle. A few minutes on 2 CPU cores.

What a policy can learn here is limited on purpose: heads are permuted within each layer per instance and nothing
about an untried head is observed, so no fixed index is the circuit; the most a policy can learn is where circuits
tend to sit (which layers) and not to waste picks, a small edge over random that 20 evaluation episodes do not
resolve (docs/TASKS.md, "Head discovery"). The oracle, which ablates every candidate, is the ceiling.
"""

from __future__ import annotations

import argparse
import time

import gymnasium
import numpy as np
import torch
from mechsandbox.gym import HeadDiscoveryEnv, greedy_oracle
from torch import nn

TASKS = ("copy-head", "induction-circuit", "committee-circuit")
TRAIN, HELD_OUT = ("copy-head", "induction-circuit"), "committee-circuit"


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi, self.v = nn.Linear(64, n_actions), nn.Linear(64, 1)

    def dist(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.distributions.Categorical:
        logits = self.pi(self.body(obs)).masked_fill(~mask, -1e9)
        return torch.distributions.Categorical(logits=logits)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.v(self.body(obs)).squeeze(-1)


def make_env(level: str, seeds: list[int] | None, sample: tuple[str, ...]) -> HeadDiscoveryEnv:
    return HeadDiscoveryEnv(tasks=TASKS, level=level, flatten=True, seeds=seeds, sample_tasks=sample)


def train(level: str, updates: int, n_envs: int = 4, n_steps: int = 32, seed: int = 0, train_seeds: int = 64,
          log: bool = True) -> tuple[Agent, list[float]]:  # fmt: skip
    """PPO with action masks: ``updates`` rollouts of ``n_envs * n_steps`` steps, 4 epochs each, on instances of
    seeds ``0 .. train_seeds - 1`` (held-out evaluation uses seeds from 10,000)."""
    torch.manual_seed(seed)
    seeds = list(range(train_seeds))
    envs = gymnasium.vector.SyncVectorEnv([lambda: make_env(level, seeds, TRAIN) for _ in range(n_envs)],
                                         autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)  # fmt: skip
    n_actions = int(envs.single_action_space.n)
    agent = Agent(int(np.prod(envs.single_observation_space.shape)), n_actions)
    optim = torch.optim.Adam(agent.parameters(), lr=3e-3)
    obs, info = envs.reset(seed=seed)
    mask = np.stack(info["action_mask"])
    curve: list[float] = []
    for update in range(updates):
        buf = {k: [] for k in ("obs", "mask", "act", "logp", "rew", "done", "val")}
        returns, running = [], np.zeros(n_envs)
        for _ in range(n_steps):
            o, m = torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(mask)
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
            next_v = agent.value(torch.as_tensor(obs, dtype=torch.float32))
        adv, last = torch.zeros(n_steps, n_envs), torch.zeros(n_envs)
        for t in reversed(range(n_steps)):  # GAE; an episode's end cuts the bootstrap
            v_next = next_v if t == n_steps - 1 else buf["val"][t + 1]
            nonterminal = 1.0 - buf["done"][t]
            delta = buf["rew"][t] + 0.99 * v_next * nonterminal - buf["val"][t]
            last = delta + 0.99 * 0.95 * nonterminal * last
            adv[t] = last
        flat = {k: torch.stack(v).flatten(0, 1) for k, v in buf.items() if k not in ("rew", "done")}
        adv = adv.flatten()
        ret = adv + flat["val"]
        for _ in range(4):
            for idx in torch.randperm(len(adv)).split(32):
                d = agent.dist(flat["obs"][idx], flat["mask"][idx])
                ratio = (d.log_prob(flat["act"][idx]) - flat["logp"][idx]).exp()
                a = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
                pg = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
                loss = pg + 0.5 * ((agent.value(flat["obs"][idx]) - ret[idx]) ** 2).mean() - 0.01 * d.entropy().mean()
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optim.step()
        curve.append(float(np.mean(returns)) if returns else float("nan"))
        if log:
            print(f"update {update + 1:3d}: mean return {curve[-1]:+.3f} over {len(returns)} episodes", flush=True)
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
                    logits = agent.dist(torch.as_tensor(obs, dtype=torch.float32)[None], torch.as_tensor(mask)[None])
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
    args = ap.parse_args()
    started = time.perf_counter()
    agent, _ = train(args.level, args.updates)
    print(f"trained in {time.perf_counter() - started:.0f} s")
    held_out_seeds = [10_000 + i for i in range(args.eval_seeds)]
    print(f"\n{'family':20} {'policy':8} {'return':>8} {'precision':>9} {'recall':>7}   (held-out seeds)")
    for task in (*TRAIN, HELD_OUT):
        for policy in ("ppo", "random", "oracle"):
            row = evaluate(policy, agent, args.level, task, held_out_seeds)
            name = f"{task}{' (held out)' if task == HELD_OUT else ''}"
            print(f"{name:20} {policy:8} {row['return']:+8.3f} {row['precision']:9.2f} {row['recall']:7.2f}")


if __name__ == "__main__":
    main()
