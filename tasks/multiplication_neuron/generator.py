"""Generator for multiplication-neuron: find the unit with h_j(x) = c * x_a * x_b.

Distractors: products sharing one factor (x_a x_c, x_c x_b), a near-product (x_a + eps x_d) x_b,
squares of a and b, and a unit mixing x_a with the product x_a x_b; every other unit has a random
job from the same catalogue. a and b vary with the seed and are stated in the prompt.
"""

from __future__ import annotations

from .. import bilinear, gated_family
from ..base import Instance
from ..rng import Stream

TASK_ID = "multiplication-neuron"
VERSION = "1"


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_in = bilinear.SIZES[level][0]
    a, b, c, d = s.sample(n_in, 4)

    def planted(cat: bilinear.Catalogue):
        distractors = [
            cat.product(a, c),
            cat.product(c, b),
            cat.near_product(a, b, d),
            cat.square(a),
            cat.square(b),
            cat.linear_times(a, b),
        ]
        if level != "easy":
            distractors += [cat.near_product(b, a, c), cat.product(a, d)]
        return cat.product(a, b), distractors

    model, unit, x = bilinear.build(s, level, planted, lambda xs: xs[:, a] * xs[:, b])
    question = (
        f"Exactly one hidden unit computes the product of inputs {a} and {b}: "
        f"h_j(x) = c * x[{a}] * x[{b}] for a constant c (up to small noise). Other units compute "
        "other products, squares, pass-throughs and mixtures. Which unit is it? (`target` is (a, b).)"
    )
    return gated_family.make_instance(TASK_ID, VERSION, seed, level, question, model, unit, x, (a, b))
