"""Generator for additive-bypass: find the unit with h_j(x) = c * x_k (a linear pass-through).

Same model kind as multiplication-neuron, its own seed stream. Distractors: pass-throughs of other
inputs, x_k mixed with a product (x_k (beta + gamma x_e)), x_k mixed with another input, the square
of x_k and products with x_k; every other unit has a random job from the same catalogue.
"""

from __future__ import annotations

from .. import bilinear, gated_family
from ..base import Instance
from ..rng import Stream

TASK_ID = "additive-bypass"
VERSION = "1"


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_in = bilinear.SIZES[level][0]
    k, e, d, f = s.sample(n_in, 4)

    def planted(cat: bilinear.Catalogue):
        distractors = [
            cat.linear(d),
            cat.linear(e),
            cat.linear_times(k, e),
            cat.near_linear(k, d),
            cat.square(k),
            cat.product(k, f),
        ]
        if level != "easy":
            distractors += [cat.linear_times(k, f), cat.near_linear(k, e), cat.linear(f)]
        return cat.linear(k), distractors

    model, unit, x = bilinear.build(s, level, planted, lambda xs: xs[:, k])
    question = (
        f"Exactly one hidden unit passes input {k} straight through: h_j(x) = c * x[{k}] for a "
        "constant c (up to small noise). Other units pass other inputs, or mix x[{k}] with products "
        f"or other inputs. Which unit is it? (`target` is {k}.)"
    ).replace("{k}", str(k))
    return gated_family.make_instance(TASK_ID, VERSION, seed, level, question, model, unit, x, k)
