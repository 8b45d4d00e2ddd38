"""What the agent is told about a fact-storage instance (easy levels also get corrupted prompts)."""

TEXT = """\
You are given `model`, a transformer with attention and MLP layers and the TransformerLens interface
({n_layers} layers x {n_heads} heads, vocabulary {vocab}, context {n_ctx}): `model(tokens)`,
`model.run_with_cache(tokens)`, `model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])`, hook names such as
`blocks.2.hook_mlp_out`, `blocks.2.hook_resid_pre` and `hook_embed` ([batch, pos, d_model]), `model.cfg`,
`utils.get_act_name`.

The model has memorised facts: subject -> attribute. In each prompt of `tokens` [{n_probe}, {n_ctx}] a subject
is a short run of subject tokens (ids 0..{last_subj}), at the same positions in every prompt; the other
positions hold filler tokens. At the last position the model predicts the subject's attribute (attribute
tokens {first_attr}..{last_vocab}; `targets` holds the right one). Measure behaviour by m = mean over prompts
of logit(target) - mean logit over the attribute tokens, at the last position.

The facts are stored in the MLP of one layer at one of the subject's positions (not necessarily its last
token). Find them by causal tracing: corrupt the subject by replacing its tokens with other subject tokens,
then restore the clean output of one MLP (`blocks.L.hook_mlp_out`) at one position t in the corrupted run,
and measure the recovered share of m: (m_restored - m_corrupt) / (m_clean - m_corrupt).
{corruption}
Answer the (layer, position) cell where restoring the MLP output recovers the most (restoring the residual
stream instead plateaus over many layers; the answer is defined on MLP outputs).

Answer: a JSON object {{"layer": L, "position": t}}, e.g. {{"layer": 2, "position": 5}}. Only that cell
scores (no partial credit for neighbouring cells). You get one graded submission."""

GIVEN = """\
`corrupted_tokens` holds the same prompts with each subject replaced by subject tokens that name no fact."""

BUILD = """\
No corrupted prompts are given: build the corruption yourself (random subject tokens in place of the
subject's; Gaussian noise on the embeddings is not a reliable corruption for this model)."""


def render(given: bool, **sizes: int) -> str:
    last_subj = sizes.pop("n_subj") - 1
    last_vocab = sizes["vocab"] - 1
    return TEXT.format(corruption=GIVEN if given else BUILD, last_subj=last_subj, last_vocab=last_vocab, **sizes)
