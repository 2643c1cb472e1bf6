"""Generation: left padding, the KV-cache decode, the response mask and truncation; the
built-in tokenizer and model."""


import pytest
import torch

from relax.rollout.generation.generate import generate, sample_next, tokenize_prompts
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy.logprobs import experience_from_rollout, response_log_probs

EOS, PAD = 1, 0


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=3).eval()


def test_tokenizer_roundtrip(tok, tmp_path):
    from transformers import AutoTokenizer

    text = "12+7=\nabc xyz"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.eos_token_id == EOS and tok.pad_token_id == PAD
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.eos_token_id == EOS


def test_tiny_model_is_deterministic_per_seed(tok):
    a, b, c = (build_tiny_model(tok, seed=s) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_greedy_decode_ignores_left_padding(tok, model):
    prompts = ["ab=", "abcd=", "1+22="]
    ids, mask = tokenize_prompts(tok, prompts, "cpu")
    assert mask[0].tolist() == [False, False, True, True, True]
    batch = generate(model, ids, mask, max_new_tokens=6, eos_token_ids=[EOS], pad_token_id=PAD,
                     temperature=0.0)
    for i, p in enumerate(prompts):
        alone = generate(model, *tokenize_prompts(tok, [p], "cpu"), max_new_tokens=6,
                         eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
        L = int(batch.response_mask[i].sum())
        assert batch.response_ids[i, :L].tolist() == alone.response_ids[0, :L].tolist()


def test_recomputed_log_probs_match_the_decode(tok, model):
    """The training-side log-probs see exactly the sequence the cached decode produced: greedy
    tokens are the argmax of the recomputed distribution at every valid position."""
    ids, mask = tokenize_prompts(tok, ["ab=", "abcd=", "1+22="], "cpu")
    r = generate(model, ids, mask, max_new_tokens=6, eos_token_ids=[EOS], pad_token_id=PAD,
                 temperature=0.0)
    exp = experience_from_rollout(r)
    with torch.no_grad():
        logp, entropy = response_log_probs(model, exp, with_entropy=True)
        full = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                     position_ids=exp.position_ids).logits[:, -7:-1].log_softmax(-1)
    best = full.max(-1).values
    m = r.response_mask
    torch.testing.assert_close(logp[m], best[m], atol=1e-5, rtol=0)
    assert torch.isfinite(entropy[m]).all() and (entropy[m] > 0).all()


@pytest.mark.parametrize("top_p,top_k", [(1.0, -1), (0.5, -1), (1.0, 3)])
@pytest.mark.parametrize("fallback", [False, True])
def test_sampler_log_probs_are_the_tempered_distribution_before_truncation(
        tok, model, top_p, top_k, fallback, monkeypatch):
    """reinforce_plus_plus.md §7a: each sampled token's log-prob under softmax(logits / T),
    the untruncated distribution the trainer's log-probs describe, from the decode engine and
    from the model-forward fallback alike (float64 recomputation from a full forward)."""
    if fallback:
        from relax.rollout.generation import generate as generate_module

        monkeypatch.setattr(generate_module, "unsupported_reason", lambda model: "forced")
    temperature = 0.7
    ids, mask = tokenize_prompts(tok, ["ab=", "abcd=", "1+22="] * 2, "cpu")
    r = generate(model, ids, mask, max_new_tokens=8, eos_token_ids=[EOS], pad_token_id=PAD,
                 temperature=temperature, top_p=top_p, top_k=top_k,
                 generator=torch.Generator().manual_seed(2))
    exp = experience_from_rollout(r)
    T = r.response_ids.shape[1]
    with torch.no_grad():
        logits = model.double()(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                                position_ids=exp.position_ids).logits[:, -T - 1:-1]
        model.float()
    want = (logits / temperature).log_softmax(-1).gather(-1, r.response_ids[..., None])[..., 0]
    m = r.response_mask
    assert r.log_probs.dtype == torch.float32 and (r.log_probs[~m] == 0).all()
    torch.testing.assert_close(r.log_probs[m].double(), want[m], atol=2e-5, rtol=0)


class _Output(dict):
    """Like a transformers ModelOutput: fields by attribute and by key."""

    __getattr__ = dict.__getitem__


class ScriptedLM(torch.nn.Module):
    """Row i emits token 5 until step ``stops[i]``, where it emits EOS (never if -1)."""

    def __init__(self, stops, vocab=8):
        super().__init__()
        self.stops, self.vocab = stops, vocab
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep=0,
                cache=None):
        step = 0 if cache is None else cache + 1
        logits = torch.full((input_ids.shape[0], 1, self.vocab), -1e9)
        for i, s in enumerate(self.stops):
            logits[i, 0, EOS if s == step else 5] = 0.0
        return _Output(logits=logits, cache=step)


def test_mask_covers_tokens_through_eos_and_truncation():
    model = ScriptedLM([0, 2, -1])
    ids, mask = torch.full((3, 2), 4), torch.ones(3, 2, dtype=torch.bool)
    r = generate(model, ids, mask, max_new_tokens=4, eos_token_ids=[EOS], pad_token_id=PAD)
    assert r.response_ids.tolist() == [[1, 0, 0, 0], [5, 5, 1, 0], [5, 5, 5, 5]]
    assert r.response_mask.tolist() == [[True, False, False, False], [True, True, True, False],
                                        [True] * 4]
    assert r.truncated.tolist() == [False, False, True]


def test_stops_early_when_every_row_ended():
    model = ScriptedLM([0, 1])
    r = generate(model, torch.full((2, 1), 4), torch.ones(2, 1, dtype=torch.bool),
                 max_new_tokens=50, eos_token_ids=[EOS], pad_token_id=PAD)
    assert r.response_ids.shape == (2, 2) and not r.truncated.any()


def test_top_k_and_top_p_filters():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(200, 1)
    g = torch.Generator().manual_seed(0)
    assert (sample_next(logits, temperature=1.0, top_p=1.0, top_k=1, generator=g) == 1).all()
    assert (sample_next(logits, temperature=1.0, top_p=0.01, top_k=-1, generator=g) == 1).all()
    two = sample_next(logits, temperature=1.0, top_p=1.0, top_k=2, generator=g)
    assert set(two.tolist()) == {1, 3}
    assert (sample_next(logits, temperature=0.0, top_p=1.0, top_k=-1, generator=g) == 1).all()


def test_empty_prompt_is_an_error(tok):
    with pytest.raises(ValueError, match="prompt 1 tokenizes to nothing"):
        tokenize_prompts(tok, ["a", ""], "cpu")


def test_seeded_sampling_is_reproducible(tok, model):
    ids, mask = tokenize_prompts(tok, ["ab="] * 4, "cpu")
    runs = [generate(model, ids, mask, max_new_tokens=5, eos_token_ids=[EOS], pad_token_id=PAD,
                     generator=torch.Generator().manual_seed(9)).response_ids for _ in range(2)]
    assert torch.equal(*runs)


def test_draw_follows_the_distribution_and_never_draws_a_zero():
    """Inverse-CDF draws: empirical frequencies of 200k draws match the probabilities (the
    largest deviation is ~4 binomial standard errors at most), zero-mass entries never appear,
    and a row with one nonzero entry always draws it."""
    from relax.rollout.generation.generate import draw

    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    n = 200_000
    got = draw(probs.expand(n, -1), torch.Generator().manual_seed(4))
    freq = torch.bincount(got, minlength=7).double() / n
    se = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert ((freq - probs.double()).abs() <= 4 * se + 1e-12).all(), freq
    assert freq[probs == 0].sum() == 0
    last = torch.zeros(3, 5)
    last[:, 4] = 1.0  # the last index: the clamp against u landing on the total
    assert draw(last, torch.Generator().manual_seed(0)).tolist() == [4, 4, 4]
    unnormalized = torch.tensor([[0.0, 3.0, 0.0]])
    assert draw(unnormalized.expand(50, -1), None).eq(1).all()


def test_rows_with_their_own_streams_draw_the_same_whatever_shares_their_batch(tok, model):
    """With one generator per row, a row's draws come from its stream only: two rows swapped
    in the batch, or one alone, sample the same tokens and log-probs (equal-length prompts, so
    the padding is the same). One generator for the batch draws what it always drew."""
    from relax.rollout.generation.generate import row_uniforms

    ids, mask = tokenize_prompts(tok, ["ab=", "cd="], "cpu")
    kw = dict(max_new_tokens=6, eos_token_ids=[EOS], pad_token_id=PAD, temperature=1.5)

    def streams(*seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    both = generate(model, ids, mask, generator=streams(1, 2), **kw)
    swapped = generate(model, ids.flip(0), mask.flip(0), generator=streams(2, 1), **kw)
    alone = generate(model, ids[1:], mask[1:], generator=streams(2), **kw)
    assert torch.equal(both.response_ids, swapped.response_ids.flip(0))
    assert torch.equal(both.log_probs, swapped.log_probs.flip(0))
    width = alone.response_ids.shape[1]
    assert torch.equal(both.response_ids[1, :width], alone.response_ids[0])
    assert not both.response_mask[1, width:].any()
    # each row's first uniform is its own stream's first draw
    assert row_uniforms(streams(1, 2), 2, "cpu").tolist() == [
        torch.rand(1, dtype=torch.float64, generator=g).item() for g in streams(1, 2)]
    assert torch.equal(row_uniforms(torch.Generator().manual_seed(7), 3, "cpu"),
                       torch.rand(3, dtype=torch.float64,
                                  generator=torch.Generator().manual_seed(7)))
    with pytest.raises(ValueError, match="1 generators for 2 rows"):
        row_uniforms(streams(1), 2, "cpu")


@pytest.mark.subprocess
@pytest.mark.parametrize("engine", [False, True])
def test_ranks_asking_for_different_lengths_decode_in_lockstep(engine):
    """With ``sync_group`` (a sharded model gathers its parameters in every forward call)
    ranks that ask for 3 and 7 new tokens run the same number of forward calls (the last
    step is the same on both, else they would wait on each other until the timeout), and
    each keeps its own limit: its rows are those it draws alone. The engine keeps computing
    rows that all ended while the other rank decodes."""
    from tests.distributed_utils import run_distributed
    from tests.rollout.generation.decode_workers import decode_on_rank

    ranks = run_distributed(decode_on_rank, 2, [3, 7], engine, timeout=120)
    (calls0, synced0, alone0), (calls1, synced1, alone1) = ranks
    assert calls0 == calls1  # the short rank went on to the long one's last step
    assert engine or calls1 > 3
    assert synced0 == alone0 and synced1 == alone1
    assert max(len(r) for r in synced0) <= 3 and max(len(r) for r in synced1) <= 7
