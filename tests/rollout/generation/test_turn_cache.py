"""KV reuse across turns (relax/rollout/generation/turn_cache.py): the turns of episodes sampled with
the kept caches are exactly those of a prefill of the whole conversation (the path before it)
with the same seed in fp32, over ragged contexts and episodes that end at different turns; an
ended episode's cache is released and its memory freed."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from relax.rollout.agents.episodes import TurnRenderer, run_episodes
from relax.rollout.generation.engine import DecodeEngine
from relax.rollout.generation.generate import generate, left_pad
from relax.rollout.generation.turn_cache import TurnCache
from relax.tiny_model import build_tiny_model, build_tokenizer
from tests.rollout.generation.test_engine import CONFIGS, _model


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0).eval()


class Ragged:
    """Ends after ``1 + seed % 4`` turns; answers with an observation whose length depends on
    the seed and the turn (so the tokens added per turn are ragged across the batch)."""

    def reset(self, seed: int) -> str:
        self.seed, self.turn = seed, 0
        return f"start {seed}"

    def step(self, action: str):
        self.turn += 1
        done = self.turn >= 1 + self.seed % 4
        return "ab" * (1 + (self.seed * 5 + self.turn * 3) % 7), float(len(action)), done


def play(tiny, seeds, *, reuse: bool, calls=None, temperature=1.0):
    tok, model = tiny
    generator = torch.Generator().manual_seed(7)

    def sample(ids, mask, k, cache=None):
        if calls is not None:
            calls.append((sorted(cache.cache.entries), sorted(cache.keys), cache.cache.tokens))
        return generate(model, ids, mask, max_new_tokens=k, eos_token_ids=[tok.eos_token_id],
                        pad_token_id=tok.pad_token_id, generator=generator,
                        temperature=temperature, cache=cache if reuse else None)

    return run_episodes([Ragged() for _ in seeds], seeds, tokenizer=tok,
                        format_prompt=lambda t: t,
                        render=TurnRenderer(tok, chat=False, eos_token_id=tok.eos_token_id),
                        sample=sample, max_turns=4, max_turn_tokens=6, context=512,
                        device="cpu")


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_kept_caches_sample_the_ids_of_a_whole_prefill(tiny, temperature):
    seeds = [0, 1, 2, 3, 3, 5, 6, 7, 10, 11]
    calls = []
    whole = play(tiny, seeds, reuse=False, temperature=temperature)
    kept = play(tiny, seeds, reuse=True, calls=calls, temperature=temperature)
    a, b = whole.rollout, kept.rollout
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.context_mask, b.context_mask)
    torch.testing.assert_close(a.log_probs, b.log_probs, rtol=0, atol=1e-5)
    assert whole.turns == kept.turns and whole.rewards == kept.rewards
    # the premises: episodes ended at different turns, each turn after the first found the
    # cache of every live episode and of no ended one
    assert len(set(kept.turns)) >= 3
    assert len(calls) >= 3 and calls[0][2] == 0
    for entries, live, tokens in calls[1:]:
        assert entries == live and tokens > 0


def test_prefill_with_a_past_equals_the_whole_prefill(tiny):
    """Ragged rows: one extended by a single token, one by many, one new (no past), one whose
    context no longer extends what was cached (computed whole)."""
    tok, model = tiny
    torch.manual_seed(0)
    first = [torch.randint(3, 40, (n,)).tolist() for n in (5, 9, 3)]
    cache = TurnCache()
    with torch.no_grad():
        out = generate(model, *left_pad(first, tok.pad_token_id, "cpu"), max_new_tokens=4,
                       eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                       generator=torch.Generator().manual_seed(1), cache=cache.rows([0, 1, 2]))
        drawn = [out.response_ids[i][out.response_mask[i]].tolist() for i in range(3)]
        rows = [first[0] + drawn[0],  # only the last drawn token is new
                first[1] + drawn[1] + [7, 8, 9, 10, 11],
                [4, 5, 6, 7],  # no past
                [9] + first[2][1:] + drawn[2] + [12]]  # changed: not a prefix any more
        ids, mask = left_pad(rows, tok.pad_token_id, "cpu")
        past = cache.rows([0, 1, 3, 2]).past(ids, mask)
        assert past.cached.tolist() == [len(rows[0]) - 1, len(first[1]) + len(drawn[1]) - 1,
                                        0, 0]
        assert cache.tokens == 0  # taken out: freed once the prefill copied them
        reused = DecodeEngine(model).prefill(ids, mask, 4, past=past)
        fresh = DecodeEngine(model).prefill(ids, mask, 4)
    torch.testing.assert_close(reused, fresh, rtol=0, atol=1e-5)


def test_an_ended_episode_frees_its_memory(tiny):
    """A turn's caches live in shared tensors: releasing one episode keeps them for the
    others, and the next turn (which copies what the live ones need) frees them."""
    tok, model = tiny
    cache = TurnCache()

    def turn(rows, keys):
        with torch.no_grad():
            return generate(model, *left_pad(rows, tok.pad_token_id, "cpu"), max_new_tokens=3,
                            eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                            generator=torch.Generator().manual_seed(2),
                            cache=cache.rows(keys))

    rows = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    out = turn(rows, ["a", "b", "c"])
    held = weakref.ref(cache.entries["a"].keys[0])
    cache.release("a")
    cache.release("b")
    assert set(cache.entries) == {"c"}
    gc.collect()
    assert held() is not None  # "c" still needs its columns
    drawn = out.response_ids[2][out.response_mask[2]].tolist()
    turn([rows[2] + drawn + [14]], ["c"])
    gc.collect()
    assert held() is None
    assert set(cache.entries) == {"c"}
    cache.release("c")
    assert cache.tokens == 0 and not cache.entries


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_architecture_extends_its_cache_exactly(name):
    """The extended prefill is the whole prefill to rounding, for every architecture the engine
    runs (Qwen3's per-head norms, biases, an untied head, llama3 RoPE scaling). Float64
    models; the cached columns of the drawn tokens carry the decode step's float32 softmax, so
    the bound is float32's (a wrong position or a missed column is off by orders more)."""
    model = _model(CONFIGS[name]())
    cache = TurnCache()
    first = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    with torch.no_grad():
        out = generate(model, *left_pad(first, 0, "cpu"), max_new_tokens=5, eos_token_ids=[1],
                       pad_token_id=0, generator=torch.Generator().manual_seed(3),
                       cache=cache.rows([0, 1, 2]))
        rows = [r + out.response_ids[i][out.response_mask[i]].tolist() + [20 + i] * (i + 1)
                for i, r in enumerate(first)]
        ids, mask = left_pad(rows, 0, "cpu")
        past = cache.rows([0, 1, 2]).past(ids, mask)
        assert past is not None and bool((past.cached > 0).all())
        reused = DecodeEngine(model).prefill(ids, mask, 5, past=past)
        fresh = DecodeEngine(model).prefill(ids, mask, 5)
    torch.testing.assert_close(reused, fresh, rtol=0, atol=1e-5)
