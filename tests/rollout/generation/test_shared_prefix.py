"""Shared prefixes prefilled once per group (relax/rollout/generation/shared_prefix.py): the
groups and their longest common token prefix against a brute-force reference; in float64 the
first decode step's logits and the whole cache equal those of the whole prefill to 1e-10 for
every architecture the engine runs; the drawn tokens are identical; the generative judge
(relax/rollout/reward/genrm.py) shares its judging prompts' prefixes by default and gives the
verdicts of the unshared judge."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relax.rollout.generation.engine as engine_module
from relax.rollout.generation.engine import DecodeEngine
from relax.rollout.generation.generate import generate, left_pad
from relax.rollout.generation.shared_prefix import shared_prefixes
from relax.rollout.reward.genrm import GenerativeJudge
from relax.tiny_model import build_tiny_model, build_tokenizer
from tests.rollout.generation.test_engine import CONFIGS, _model


def _rms64(x, weight, eps):
    # the engine's RMSNorm takes its statistics in float32 (as the model does); kept in the
    # input dtype here so a float64 comparison sees only what the sharing changes
    return weight * F.rms_norm(x, (x.shape[-1],), None, eps)


@pytest.fixture
def float64_norms(monkeypatch):
    monkeypatch.setattr(engine_module, "_rms", _rms64)


def _reference(rows, keys):
    """Brute force: each row's group and the tokens every row of its group has in common,
    at most one less than the group's shortest row."""
    out = []
    for k in keys:
        members = [r for r, k2 in zip(rows, keys, strict=True) if k2 == k]
        n = 0
        while all(len(r) > n + 1 for r in members) and len({r[n] for r in members}) == 1:
            n += 1
        out.append(n)
    return out


def test_groups_and_their_common_prefixes():
    rows = [[5, 6, 7, 8, 9], [5, 6, 7, 2], [5, 6, 7, 8, 9, 3],  # group a: diverge after 3
            [4, 4, 4], [4, 4, 4],  # b: identical rows keep their last token to compute
            [9, 8, 7, 6],  # c: a group of one, all but its last token
            [1, 2, 3], [1, 2, 3, 4, 5],  # d: one row begins the other
            [7, 1], [8, 1]]  # e: nothing in common
    keys = ["a", "a", "a", "b", "b", "c", "d", "d", "e", "e"]
    shared = shared_prefixes(rows, keys)
    assert shared.group.tolist() == [0, 0, 0, 1, 1, 2, 3, 3, 4, 4]
    assert shared.first.tolist() == [0, 3, 5, 6, 8]
    assert shared.length[shared.group].tolist() == _reference(rows, keys) == \
        [3, 3, 3, 2, 2, 3, 2, 2, 0, 0]
    assert shared.saved_tokens() == 2 * 3 + 2 + 2
    # nothing to reuse: a plain prefill
    assert shared_prefixes([[1, 2], [3, 4]], ["x", "y"]) is None
    assert shared_prefixes([[1, 2], [3, 4]], ["x", "x"]) is None


def _grouped_rows(seed: int, vocab: int = 40):
    """Ragged rows in groups: a shared head of 2-9 tokens, then each row's own 1-6 tokens;
    a group of one, a group with a repeated row and a group without a common token."""
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        return torch.randint(2, vocab, (n,), generator=g).tolist()

    rows, keys = [], []
    for key, (head, sizes) in enumerate([(9, [3, 1, 6]), (2, [4, 2]), (5, [3]), (0, [2, 5]),
                                         (4, [2, 2])]):
        prefix = draw(head)
        for size in sizes:
            rows.append(prefix + draw(size))
            keys.append(key)
    rows[-1] = list(rows[-2])  # a repeated sample
    return rows, keys


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_shared_prefill_is_the_whole_prefill(name, float64_norms):
    """Every architecture (Qwen3's per-head norms, biases, an untied head, llama3 RoPE
    scaling): the first step's logits and every real column of the cache in float64 to
    1e-10, then steps fed the same tokens (the decode's float32 softmax: its bound)."""
    model = _model(CONFIGS[name]())
    rows, keys = _grouped_rows(seed=1)
    shared = shared_prefixes(rows, keys)
    assert shared is not None and shared.saved_tokens() > 0
    ids, mask = left_pad(rows, 0, "cpu")
    T = 5
    steps = torch.randint(2, 40, (T, len(rows)), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole, once = DecodeEngine(model), DecodeEngine(model)
        a, b = whole.prefill(ids, mask, T), once.prefill(ids, mask, T, shared=shared)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
        for ka, kb in zip(whole.k_cache + whole.v_cache, once.k_cache + once.v_cache,
                          strict=True):
            real = mask[:, None, :, None].expand_as(ka[:, :, :ids.shape[1]])
            torch.testing.assert_close(kb[:, :, :ids.shape[1]][real],
                                       ka[:, :, :ids.shape[1]][real], rtol=0, atol=1e-10)
        for t in range(T - 1):
            torch.testing.assert_close(once.step(steps[t]), whole.step(steps[t]), rtol=0,
                                       atol=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_generate_draws_the_tokens_of_the_whole_prefill(temperature):
    """Production numerics (float32 norms, fp32 model): the same tokens, greedy and sampled
    from the same stream, and log-probs within float32 rounding."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=4).eval()
    rows, keys = _grouped_rows(seed=3, vocab=len(tok))
    ids, mask = left_pad(rows, tok.pad_token_id, "cpu")

    def run(shared):
        return generate(model, ids, mask, max_new_tokens=8, eos_token_ids=[tok.eos_token_id],
                        pad_token_id=tok.pad_token_id, temperature=temperature,
                        generator=torch.Generator().manual_seed(5), shared=shared)

    a, b = run(None), run(shared_prefixes(rows, keys))
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(b.log_probs, a.log_probs, rtol=0, atol=1e-5)


PROMPTS = ["What is 12+30?", "What is 12+30?", "What is 12+30?", "Name 7 of 9.", "Name 7 of 9."]
RESPONSES = ["42", "It is 42, I think", "40", "seven", "7"]
LABELS = ["42", "42", "42", "7", "7"]


def _judges(monkeypatch, seen):
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=6, num_hidden_layers=2).double().eval()
    prefill = DecodeEngine.prefill

    def spy(self, ids, mask, max_new_tokens, past=None, shared=None):
        seen.append(shared)
        return prefill(self, ids, mask, max_new_tokens, past=past, shared=shared)

    monkeypatch.setattr(DecodeEngine, "prefill", spy)
    monkeypatch.setattr(engine_module, "_rms", _rms64)

    def judge(share):
        return GenerativeJudge(model, tok, eos_token_ids=[tok.eos_token_id],
                               template="Q: {prompt} Ref: {label} A: {response} ok?",
                               max_new_tokens=6, bf16=False, device=torch.device("cpu"),
                               share_prefixes=share)

    return tok, judge


def test_the_judge_shares_its_prompts_beginning_and_keeps_its_verdicts(monkeypatch):
    seen = []
    tok, make = _judges(monkeypatch, seen)
    plain, shared = make(False), make(True)
    assert shared.share_prefixes and GenerativeJudge.__init__.__kwdefaults__["share_prefixes"]
    rewards = plain(PROMPTS, RESPONSES, LABELS)
    assert shared(PROMPTS, RESPONSES, LABELS) == rewards
    assert shared.last_verdicts == plain.last_verdicts
    assert seen[0] is None
    # the groups are the prompts; each shares the tokens up to where its responses differ
    rows = [tok(shared.judging_prompt(p, r, y), add_special_tokens=False)["input_ids"]
            for p, r, y in zip(PROMPTS, RESPONSES, LABELS, strict=True)]
    assert seen[1].group.tolist() == [0, 0, 0, 1, 1]
    assert seen[1].length[seen[1].group].tolist() == _reference(rows, PROMPTS)
    head = len(tok("Q: What is 12+30? Ref: 42 A: ", add_special_tokens=False)["input_ids"])
    assert seen[1].length.tolist()[0] == head  # where "42", "It is..." and "40" part


def test_the_judges_first_logits_equal_the_unshared_prefill(monkeypatch):
    """The judge's own rows through both prefills, float64: 1e-10."""
    seen = []
    tok, make = _judges(monkeypatch, seen)
    judge = make(True)
    judge(PROMPTS, RESPONSES, LABELS)
    rows = [tok(judge.judging_prompt(p, r, y), add_special_tokens=False)["input_ids"]
            for p, r, y in zip(PROMPTS, RESPONSES, LABELS, strict=True)]
    ids, mask = left_pad(rows, tok.pad_token_id, "cpu")
    with torch.no_grad():
        a = DecodeEngine(judge.sampler.model).prefill(ids, mask, 6)
        b = DecodeEngine(judge.sampler.model).prefill(ids, mask, 6, shared=seen[0])
    assert seen[0] is not None
    torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
