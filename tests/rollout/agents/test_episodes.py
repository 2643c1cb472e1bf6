"""Episode rollout on the built-in tiny model against a scripted environment: the loss mask
covers exactly the model's tokens, the token ids are the sampled ids, the environment sees
the decoded turns, and the model attends to the environment's tokens."""

import pytest
import torch

from relax.errors import InputError
from relax.rollout.agents.episodes import TurnRenderer, run_episodes
from relax.rollout.generation.generate import generate
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy.logprobs import experience_from_rollout, response_log_probs
from tests.rollout.agents import scripted

CHAT = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0).eval()


def _play(tok, model, seeds, *, max_turns=3, chat=False, max_turn_tokens=4, context=256,
          envs=None):
    calls = []
    generator = torch.Generator().manual_seed(0)

    def sample(ids, mask, k, cache=None):
        out = generate(model, ids, mask, max_new_tokens=k, eos_token_ids=[tok.eos_token_id],
                       pad_token_id=tok.pad_token_id, generator=generator, cache=cache)
        calls.append((ids, mask, out))
        return out

    envs = envs or [scripted.QuietCountdown() for _ in seeds]
    played = run_episodes(envs, seeds, tokenizer=tok, format_prompt=lambda t: t,
                          render=TurnRenderer(tok, chat=chat, eos_token_id=tok.eos_token_id),
                          sample=sample, max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                          context=context, device="cpu")
    return played, calls


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat-template"])
def test_mask_is_exactly_the_sampled_tokens(tiny, chat):
    tok, model = tiny
    if chat:
        tok = build_tokenizer()
        tok.chat_template = CHAT
    seeds = [3, 3, 8, 8]
    envs = [scripted.QuietCountdown() for _ in seeds]
    played, calls = _play(tok, model, seeds, chat=chat, envs=envs)
    render = TurnRenderer(tok, chat=chat, eos_token_id=tok.eos_token_id)
    r = played.rollout
    assert len(calls) == 3 and played.turns == [3, 3, 3, 3]
    for i in range(len(seeds)):
        sampled = [c[2].response_ids[i][c[2].response_mask[i]].tolist() for c in calls]
        # what the episode holds: turn, observation, turn, observation, turn
        expected, trained = [], []
        for turn, ids in enumerate(sampled):
            expected += ids
            trained += [True] * len(ids)
            if turn < 2:
                ended = bool(ids) and ids[-1] == tok.eos_token_id
                obs = render(f"T-{2 - turn}", ended=ended)
                expected += obs
                trained += [False] * len(obs)
        present = r.context_mask[i]
        assert r.response_ids[i][present].tolist() == expected
        assert r.response_mask[i][present].tolist() == trained
        assert not r.response_mask[i][~present].any()
        # each turn's context is the prompt plus exactly the ids so far (never re-tokenized)
        prompt = r.prompt_ids[i][r.prompt_mask[i]].tolist()
        for turn in (1, 2):
            ids, mask, _ = calls[turn]
            fed = ids[i][mask[i]].tolist()
            assert fed[:len(prompt)] == prompt
            assert fed[len(prompt):] == expected[:len(fed) - len(prompt)]
        # the environment was given each turn's decoded model tokens
        assert envs[i].actions == [tok.decode(ids, skip_special_tokens=True) for ids in sampled]
    # the episode reward is the sum of the step rewards
    assert played.rewards == pytest.approx([sum(((s % 5) + len(a)) / 10.0 for a in e.actions)
                                            for s, e in zip(seeds, envs, strict=True)])
    assert not r.truncated.any()  # the environment ended every episode


def test_chat_renderer_closes_a_cut_turn(tiny):
    tok = build_tokenizer()
    tok.chat_template = CHAT
    render = TurnRenderer(tok, chat=True, eos_token_id=tok.eos_token_id)
    assert tok.decode(render("hi", ended=True)) == "\n[user]hi<eos>\n[assistant]"
    assert tok.decode(render("hi", ended=False)) == "<eos>\n[user]hi<eos>\n[assistant]"
    plain = TurnRenderer(tok, chat=False, eos_token_id=tok.eos_token_id)
    assert plain("hi", ended=False)[0] == tok.eos_token_id
    assert tok.decode(plain("hi", ended=True)) == "hi\n"


def test_the_model_reads_the_environment_tokens(tiny):
    """Log-probs of the batched training forward equal a forward over each unpadded episode,
    which attends to every token: environment tokens are context, not holes of attention."""
    tok, model = tiny
    # two episodes of one seed share their prompt: the training forward then runs it once
    # and the turns attend to its cached keys (logprobs._response_logits), also checked here
    played, _ = _play(tok, model, [1, 1, 2])
    exp = experience_from_rollout(played.rollout)
    P = played.rollout.prompt_ids.shape[1]
    assert torch.equal(exp.attention_mask[:, P:].bool(), played.rollout.context_mask)
    assert torch.equal(exp.response_mask, played.rollout.response_mask)
    with torch.no_grad():
        batched, _ = response_log_probs(model, exp)
        for i in range(3):
            seq = exp.input_ids[i][exp.attention_mask[i].bool()]
            logits = model(input_ids=seq[None]).logits[0, :-1].float()
            ref = torch.log_softmax(logits, -1).gather(-1, seq[1:, None]).squeeze(-1)
            prompt_len = int(played.rollout.prompt_mask[i].sum())
            ref = ref[prompt_len - 1:]  # predictions of the response tokens
            mine = batched[i][played.rollout.context_mask[i]]
            assert torch.allclose(mine, ref, atol=1e-5)


def test_an_episode_ends_when_the_context_is_full(tiny):
    tok, model = tiny
    played, calls = _play(tok, model, [4], max_turns=5, context=11, max_turn_tokens=4)
    # prompt "go4" (3) + a turn (>= 1) + "T-2\n" (4) + a full turn (4) passes 11: one turn
    assert played.turns == [1] and bool(played.rollout.truncated[0])
    with pytest.raises(InputError, match="does not fit the model's context of 5"):
        _play(tok, model, [4], context=5, max_turn_tokens=4)


def test_a_raising_environment_fails_its_episode_only(tiny):
    tok, model = tiny
    envs = [scripted.Broken() for _ in range(4)]
    played, _ = _play(tok, model, [1, 2, 3, 4], envs=envs)
    assert len(played.errors) == 2 and "the game server went away" in played.errors[0]
    assert played.turns == [2, 3, 2, 3]
    assert played.rewards[0] == 0.0 and played.rewards[2] == 0.0
    assert bool(played.rollout.truncated[0]) and not bool(played.rollout.truncated[1])


def test_a_mixture_of_experts_records_the_model_tokens_only():
    """Each model turn's record (the decode's, at the tokens it sampled) at those tokens'
    columns; the prompt and the environment's tokens have none (-1)."""
    from relax.tiny_model import build_tiny_moe

    tok = build_tokenizer()
    model = build_tiny_moe(tok, seed=0).eval()
    played, calls = _play(tok, model, [3, 8])
    r = played.rollout
    P = r.prompt_ids.shape[1]
    rec = r.routed_experts
    assert rec.shape[:2] == (2, P + r.response_ids.shape[1])
    assert (rec[:, :P] == -1).all()
    response = rec[:, P:]
    trained, context = r.response_mask, r.context_mask
    assert (response[context & ~trained] == -1).all()  # the environment's tokens
    assert (response[~context] == -1).all()
    for i in range(2):
        turns = [c[2].routed_experts[i, c[0].shape[1]:][c[2].response_mask[i]] for c in calls]
        assert torch.equal(response[i][trained[i]], torch.cat(turns))
