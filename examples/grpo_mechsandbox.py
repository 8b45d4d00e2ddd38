"""Train a tool-calling policy on MechSandbox with TRL's GRPOTrainer.

    pip install 'mechsandbox[trl]'
    mechsandbox serve &                                   # or point --url / $MECHSANDBOX_URL at a server
    python examples/grpo_mechsandbox.py --model Qwen/Qwen3-0.6B --tasks dead-neurons,additive-bypass

Each dataset row is one train instance (task, level, seed); GRPO plays it ``--num-generations`` times, every
rollout in its own server session, and the reward is the episode's graded score (0.01 when nothing was graded).
The rollouts of one batch hold a session each until their rewards are read, so ``--batch-size`` must fit the
server's session cap (64 by default; a remote client gets a quarter of it).

``--tiny`` builds a tiny random-weight model and tokenizer here (nothing downloaded): a smoke test of the loop on a
CPU, not training. Its completions are noise, so its rewards sit at the floor.

Torch's CPU work here runs on one intra-op thread unless ``OMP_NUM_THREADS`` (or an earlier ``set_num_threads``)
says otherwise, the rule the Gym env and the server's workers follow (``mechsandbox.torch_threads``): on a CPU shared
with a local server, a thread per core spins against the server's generation. A GPU run does not depend on it; a
real model trained on an idle CPU wants ``OMP_NUM_THREADS`` set to its cores.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="a chat model that calls tools (Hub id or path)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model built here: a CPU smoke run")
    parser.add_argument("--tasks", default="dead-neurons", help="family ids, comma-separated (`mechsandbox tasks`)")
    parser.add_argument("--levels", default="easy", help="easy, medium, hard, comma-separated")
    parser.add_argument("--seeds", type=int, default=64, help="train instances per (task, level): seeds 0..n-1")
    parser.add_argument("--num-generations", type=int, default=4, help="rollouts per instance (GRPO's group)")
    parser.add_argument("--batch-size", type=int, default=4, help="rollouts per device step (a multiple of the group)")
    parser.add_argument("--max-steps", type=int, default=100, help="optimiser steps")
    parser.add_argument("--max-completion-length", type=int, default=4096, help="tokens per rollout, tool results too")
    parser.add_argument("--max-tool-calls", type=int, default=24, help="tool-calling turns per rollout")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--url", default=None, help="the server (default $MECHSANDBOX_URL, else one started here)")
    parser.add_argument("--output-dir", default="grpo-mechsandbox")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental in TRL 1.x
    from mechsandbox.torch_threads import configure_torch_threads

    threads = configure_torch_threads()
    print(f"grpo_mechsandbox: {args.max_steps} steps of {args.batch_size} rollouts on {args.tasks} ({args.levels}), "
          f"torch on {threads} CPU thread{'s' * (threads != 1)}", flush=True)  # fmt: skip
    import torch
    from mechsandbox.integrations.trl import environment_factory, episode_dataset
    from trl import GRPOConfig, GRPOTrainer

    if args.tiny:
        from mechsandbox.integrations.tiny_chat import tiny_chat_model

        model, tokenizer = tiny_chat_model()
    else:
        model, tokenizer = args.model, None  # GRPOTrainer loads both from the Hub id or path
    gpu = torch.cuda.is_available()
    config = GRPOConfig(
        use_cpu=not gpu,
        bf16=gpu and torch.cuda.is_bf16_supported(),  # GRPOConfig's default (bf16) refuses to run on a CPU
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calls,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        train_dataset=episode_dataset(args.tasks, args.levels, args.seeds),
        environment_factory=environment_factory(args.url),
    )
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    if rewards:
        print(f"grpo_mechsandbox: {len(rewards)} steps; mean reward per step: {', '.join(f'{r:.3f}' for r in rewards)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
