"""A hand-played induction-circuit episode, written as a TransformerLens user writes it, through a running server.

    mechsandbox serve --port 8766 &
    python bench/hand_episode.py --url http://localhost:8766 [--seed 11 --level medium]

Prints each step's output and how many code steps failed. Why: issue 17 counted 3 of 7 failed steps in such an
episode (imports, hooks, strings) before the namespace grew; this replays a fixed one so the figure can be re-measured
(docs/SANDBOX.md, "Researcher ergonomics"). The answer it submits is the naive one (highest detection scores), so
its score says nothing about the family: on medium the decoys it meets are meant to fool exactly that.
"""

from __future__ import annotations

import argparse
import json

from mechsandbox.client import MechSandboxEnv

STEPS = [
"model.cfg",
"""import einops
from transformer_lens import utils
half = model.cfg.n_ctx // 2
torch.manual_seed(0)
r = torch.randint(0, model.cfg.d_vocab, (16, half))
rep = torch.cat([r, r], dim=1)
_, cache = model.run_with_cache(rep)
ind = einops.reduce(cache['pattern', 1].diagonal(offset=1 - half, dim1=-2, dim2=-1), 'b h k -> h', 'mean')
prev = einops.reduce(cache['pattern', 0].diagonal(offset=-1, dim1=-2, dim2=-1), 'b h k -> h', 'mean')
print('induction', [round(x, 2) for x in ind.tolist()])
print('previous', [round(x, 2) for x in prev.tolist()])""",
"""def loss_with(fwd_hooks):
    with model.hooks(fwd_hooks=fwd_hooks):
        return model(rep, return_type='loss', loss_per_token=True)[:, half:].mean().item()
base = loss_with([])
effects = {}
for layer in range(model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        def ablate(z, hook, head=head):
            z[:, :, head] = 0
            return z
        effects[(layer, head)] = loss_with([(utils.get_act_name('z', layer), ablate)]) - base
top = sorted(effects, key=effects.get, reverse=True)[:4]
[(k, round(effects[k], 3)) for k in top]""",
"""kcomp = torch.zeros(model.cfg.n_heads, model.cfg.n_heads)
for h0 in range(model.cfg.n_heads):
    for h1 in range(model.cfg.n_heads):
        a, b = model.OV[0, h0].AB, model.QK[1, h1].AB
        kcomp[h0, h1] = (b.T @ a.T).norm() / (a.norm() * b.norm())
kcomp.argmax().item() // model.cfg.n_heads, kcomp.argmax().item() % model.cfg.n_heads""",
"model.to_str_tokens(tokens[0])[:6]",
"""try:
    model.to_tokens('not a token')
except Exception as e:
    print(type(e).__name__, e)
[n for n in dir() if not n.startswith('_')][:12]""",
"""L1 = max(range(model.cfg.n_heads), key=lambda h: ind[h].item())
L0 = max(range(model.cfg.n_heads), key=lambda h: prev[h].item())
answer = {'heads': [[0, L0], [1, L1]], 'roles': {f'L0H{L0}': 'previous-token', f'L1H{L1}': 'induction'}}
answer""",
]



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--level", default="medium")
    args = ap.parse_args()
    failed = 0
    with MechSandboxEnv(base_url=args.url).sync() as env:
        env.reset(task_id="induction-circuit", seed=args.seed, level=args.level)
        for i, code in enumerate(STEPS, 1):
            o = env.run(code).observation
            failed += bool(o.error)
            print(f"--- step {i} {'FAILED' if o.error else 'ok'}\n{o.stdout_or_error[:600]}")
        result = env.submit(json.loads(env.run("import json\nprint(json.dumps(answer))").observation.stdout_or_error))
        print("score", result.reward, "truth", json.dumps(result.observation.truth))
    print(f"{failed} of {len(STEPS)} code steps failed")


if __name__ == "__main__":
    main()
