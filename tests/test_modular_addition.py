"""modular-addition's planted properties: the model adds mod p on every pair, the stated frequency
ablation rule holds with a margin, and spectra of single weight matrices cannot tell the keys from the
distractors (docs/CONTRACT.md, "The families", 8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import cached_instance
from mechsandbox.tasks import LEVELS, grade
from mechsandbox.tasks.fourier_frequencies.generator import freq_power
from mechsandbox.tasks.modular_addition.generator import frequency_drops, grid_margin, logit_margin

SEEDS = range(8)


@pytest.mark.parametrize("level", LEVELS)
def test_the_model_adds_mod_p_on_every_pair(level: str) -> None:
    for seed in SEEDS:
        inst = cached_instance("modular-addition", seed, level)
        tokens, p = inst.probe["tokens"], inst.probe["p"]
        assert tokens.shape == (p * p, 2)
        with torch.no_grad():
            predicted = inst.model(tokens).argmax(dim=1)
        assert bool((predicted == (tokens[:, 0] + tokens[:, 1]) % p).all()), seed


@pytest.mark.parametrize("level", LEVELS)
def test_frequency_ablation_rule_holds_with_margin(level: str) -> None:
    for seed in SEEDS:
        inst = cached_instance("modular-addition", seed, level)
        drops = frequency_drops(inst.model, inst.probe["tokens"])
        drops = drops / drops.max()
        keys = inst.truth["frequencies"]
        assert min(drops[k - 1] for k in keys) >= 0.5
        assert max(drops[k - 1] for k in range(1, len(drops) + 1) if k not in keys) <= 0.05


@pytest.mark.parametrize("level", LEVELS)
def test_the_closed_form_margin_is_the_prompts_margin(level: str) -> None:
    """The generator measures the ablation with grid_margin (FFT over the pair grid); it must be the prompt's
    quantity computed from the logits, clean and with a frequency projected out."""
    inst = cached_instance("modular-addition", 0, level)
    tokens, p = inst.probe["tokens"], inst.probe["p"]
    w_e = inst.model.embed.weight.detach().double()
    k = inst.truth["frequencies"][0]
    wave = torch.stack(
        [torch.cos(2 * torch.pi * k * torch.arange(p) / p), torch.sin(2 * torch.pi * k * torch.arange(p) / p)], 1
    )
    wave = wave.double() / wave.double().norm(dim=0)
    ablated = w_e - wave @ (wave.T @ w_e)
    for emb in (None, ablated):
        assert grid_margin(inst.model, emb) == pytest.approx(logit_margin(inst.model, tokens, emb), rel=1e-5, abs=1e-5)
    assert logit_margin(inst.model, tokens, ablated) < 0.8 * logit_margin(inst.model, tokens)  # a key matters


def _spectrum_answer(power: np.ndarray) -> list[int]:
    power = power / power.max()
    return [k + 1 for k in range(len(power)) if power[k] >= 0.4]


@pytest.mark.parametrize("level", LEVELS)
def test_single_matrix_spectra_do_not_give_the_keys(level: str) -> None:
    """The fourier-frequencies method (DFT of W_E) and the same on W_U both score poorly: distractor
    frequencies are as strong as the keys in each matrix, and some are in both."""
    by_embed, by_unembed = [], []
    for seed in range(20):
        inst = cached_instance("modular-addition", seed, level)
        w_e = inst.model.embed.weight.detach().double().numpy()
        w_u = inst.model.unembed.weight.detach().double().numpy()
        by_embed.append(grade("modular-addition", _spectrum_answer(freq_power(w_e)), inst.truth).score)
        by_unembed.append(grade("modular-addition", _spectrum_answer(freq_power(w_u)), inst.truth).score)
        both = set(_spectrum_answer(freq_power(w_e))) & set(_spectrum_answer(freq_power(w_u)))
        assert both > set(inst.truth["frequencies"]), "some distractor is strong in both matrices"
    assert np.mean(by_embed) <= 0.6 and np.mean(by_unembed) <= 0.6, (np.mean(by_embed), np.mean(by_unembed))
