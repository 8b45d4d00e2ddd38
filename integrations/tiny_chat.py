"""A tiny chat model and tokenizer built here, from a config, for GRPO smoke runs that download nothing.

Why: a training loop against MechSandbox should be testable on a CPU without a model hub. The tokenizer is a
byte-level BPE trained in well under a second on the tool-calling chat template and the episode instructions
(byte-level, so it encodes any text a tool returns), with Qwen3's chat template as TRL ships it: TRL recognises
that template and parses ``<tool_call>`` blocks in completions, so the tiny model takes the same multi-turn path
a real Qwen3 policy does.

Two models:
- ``tiny_chat_model()``: a small GPT-2 with random weights (what a smoke run trains: its completions are noise, so
  its rewards sit at the floor unless something else submits);
- ``tiny_chat_model(tool_call=(name, arguments))``: a *scripted* policy, a one-layer GPT-2 whose weights are set
  so that every turn it emits exactly that tool call and ends the turn (a bigram table: the attention and MLP
  write nothing, the embedding is one-hot and the unembedding maps each token to its successor with margins of
  about 40 logits, so sampling and one small optimiser step do not change what it says). The tests use it to
  drive each path of the environment (a graded answer, the budget, a refused answer, a dead server) through
  TRL's real tool loop.
"""

from __future__ import annotations

import json
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<think>", "</think>"]  # fmt: skip
MAX_POSITIONS = 8192  # the task text, the tools' schemas and a few tool results fit; longer rollouts are cut


def tiny_tokenizer(vocab_size: int = 512, extra_tokens: tuple[str, ...] = ()) -> Any:
    """A byte-level BPE tokenizer with Qwen3's chat template (as TRL ships it), trained on the template and the
    episode instructions; ``extra_tokens`` are added whole (the scripted policy's tool call)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    from .mcp_client import INSTRUCTIONS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    bpe.train_from_iterator([qwen3_chat_template, INSTRUCTIONS], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        model_max_length=MAX_POSITIONS)  # fmt: skip
    if extra_tokens:
        tokenizer.add_tokens(list(extra_tokens))
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The body of a Qwen3 tool call, between ``<tool_call>`` and ``</tool_call>``."""
    return "\n" + json.dumps({"name": name, "arguments": arguments}) + "\n"


def tiny_chat_model(tool_call: tuple[str, dict[str, Any]] | None = None, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: random weights (seeded), or the scripted policy that always makes ``tool_call``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    body = tool_call_text(*tool_call) if tool_call else None
    tokenizer = tiny_tokenizer(extra_tokens=(body,) if body else ())
    vocab = len(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    common = {"vocab_size": vocab, "n_positions": MAX_POSITIONS, "tie_word_embeddings": False,
              "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
              "pad_token_id": ids["<|endoftext|>"],
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # fmt: skip
    # no dropout: a model built here is in training mode, and TRL generates with it so; the scripted policy's
    # one-hot embedding would lose its token one time in ten
    torch.manual_seed(seed)
    if body is None:
        return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=2, **common)), tokenizer

    model = GPT2LMHeadModel(GPT2Config(n_embd=vocab, n_layer=1, n_head=1, **common))
    start, call, end = ids["<tool_call>"], tokenizer.convert_tokens_to_ids(body), ids["<|im_end|>"]
    successor = {start: call, call: ids["</tool_call>"], ids["</tool_call>"]: end}  # anything else: start a call
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()  # the blocks add nothing to the residual stream; no position embedding
        model.transformer.wte.weight.copy_(torch.eye(vocab))
        for norm in [model.transformer.ln_f] + [n for b in model.transformer.h for n in (b.ln_1, b.ln_2)]:
            norm.weight.fill_(1.0)
        # ln_f turns the one-hot row into about sqrt(V) on its token and -1/sqrt(V) elsewhere; the small bias keeps
        # the "start a call" row (which sums almost every column) clearly above zero for every ordinary token
        model.transformer.ln_f.bias.fill_(0.03)
        table = torch.zeros(vocab, vocab)
        for token in range(vocab):
            table[successor.get(token, start), token] = 5.0
        model.lm_head.weight.copy_(table)
    return model, tokenizer
