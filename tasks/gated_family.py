"""What multiplication-neuron and additive-bypass share beyond the model: prompt, instance, grader.

Both ask for the one hidden unit of a :class:`~mechsandbox.arch.GatedMLP` that computes a stated function of
the inputs; they differ in the function (a product or a pass-through), in their distractors and in
their seed stream (so one instance never answers the other).
"""

from __future__ import annotations

from typing import Any

from ..answer_kind import AnswerKind
from ..arch import GatedMLP
from . import bilinear
from .base import Instance
from .grading import Grade, grade_index_set, parse_indices
from .schemas import index_schema

PROMPT = """\
You are given `model`, a gated MLP on {n_in} inputs: h = model.left(x) * model.right(x) is the hidden
layer of {d} units (`model.hidden` is an identity module applied to h, handy for hooks), and
y = model.out(h) has {n_out} outputs. Inputs are drawn uniformly from the box [{lo}, {hi}]^{n_in};
`X` holds {n_probe} such samples, `box` is (lo, hi) and `target` is {target!r}.

{question}

Answer: a JSON list with the index of that hidden unit (0..{last}), e.g. [5]. You get one graded
submission; listing extra units lowers the score."""


def answer_schema(level: str) -> dict:
    return index_schema(bilinear.SIZES[level][1], 1, "index of the hidden unit")


def make_instance(
    task_id: str,
    version: str,
    seed: int,
    level: str,
    question: str,
    model: GatedMLP,
    unit: int,
    x: Any,
    target: Any,
) -> Instance:
    n_in, d, n_out, _ = bilinear.SIZES[level]
    text = PROMPT.format(
        n_in=n_in,
        d=d,
        n_out=n_out,
        lo=bilinear.LO,
        hi=bilinear.HI,
        n_probe=bilinear.N_PROBE,
        last=d - 1,
        question=question,
        target=target,
    )
    return Instance(
        task_id=task_id,
        level=level,
        seed=seed,
        family_version=version,
        model=model,
        probe={"X": x, "box": (bilinear.LO, bilinear.HI), "target": target},
        config=bilinear.config(level),
        prompt=text,
        answer_schema=answer_schema(level),
        truth={"kind": AnswerKind.INDICES, "n": d, "indices": [unit]},
    )


def grade(answer: Any, truth: dict) -> Grade:
    return grade_index_set(parse_indices(answer, truth["n"], "unit"), set(truth["indices"]))
