"""``--rm-type genrm``: the verdict parser, the template rules and the judge's batched greedy
decode on a tiny model built in code (relax/rollout/reward/genrm.py, relax/rollout/reward/judge.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from relax.config.judge_template import DEFAULT_TEMPLATE, fill_template, template_problem
from relax.config.sections import RewardsSection
from relax.errors import InputError
from relax.rollout.reward.genrm import GenerativeJudge, parse_verdict
from relax.rollout.reward.judge import build_judge
from relax.tiny_model import build_tiny_model, build_tokenizer


@pytest.mark.parametrize("text,reward", [
    ("Yes", 1.0), (" no.", 0.0), ("The answer is correct", 1.0), ("INCORRECT, sorry", 0.0),
    ("wrong", 0.0), ("True", 1.0), ("Noted... yes", 1.0),  # "Noted" is not the word "no"
    ("No, yes", 0.0), ("", None), ("maybe?", None), ("yesterday", None)])
def test_the_first_verdict_word_is_the_reward(text, reward):
    assert parse_verdict(text) == reward


def test_template_rules():
    assert template_problem(DEFAULT_TEMPLATE) is None
    assert template_problem("Judge: {response}") is None
    assert "has no {response} field" in template_problem("Question {prompt} answer {label}")
    assert "unknown field {answer}" in template_problem("{response} vs {answer}")
    assert "not a template" in template_problem("{response} {")
    assert template_problem("literal {{braces}} around {response}") is None
    # filled by the parse that validated it: text holding braces is inserted as it is
    assert fill_template("{{x}} {response}", prompt="", response="{label:>9}", label=1) == \
        "{x} {label:>9}"
    # a reasoning-gym item's answer fills {label}
    filled = fill_template("{prompt}|{response}|{label}", prompt="1+1", response="2",
                           label={"answer": "2", "metadata": {}})
    assert filled == "1+1|2|2"


def _tiny_judge_dir(tmp_path, seed=5):
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model.save_pretrained(tmp_path / "judge")
    tok.save_pretrained(tmp_path / "judge")
    return str(tmp_path / "judge")


def _rollout_section(path, template=None, max_len=6):
    return RewardsSection(rm_type="genrm", genrm_model_path=path, genrm_prompt_template=template,
                          genrm_max_response_len=max_len)


PROMPTS = ["1+1=", "1+1=", "2+3=", "2+3="]
RESPONSES = ["2", "3", "5", "a long wrong answer"]
LABELS = ["2", "2", "5", "5"]


def test_the_judge_decodes_the_batch_greedily_as_the_model_does_one_by_one(tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("Q {prompt} A {response} R {label} ok?")
    judge = build_judge(_rollout_section(_tiny_judge_dir(tmp_path), str(template)),
                        torch.device("cpu"), bf16=False)
    assert judge.judging_prompt("1+1=", "3", "2") == "Q 1+1= A 3 R 2 ok?"
    rewards = judge(PROMPTS, RESPONSES, LABELS)
    batched = list(judge.last_verdicts)
    # an independent decode: the model's own greedy generate, one sample at a time
    model, tok = judge.sampler.model, judge.tokenizer
    for i, (p, r, y) in enumerate(zip(PROMPTS, RESPONSES, LABELS, strict=True)):
        ids = tok(f"Q {p} A {r} R {y} ok?", return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=6, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True) == \
            batched[i]
    parsed = [parse_verdict(v) for v in batched]
    assert rewards == [0.0 if v is None else v for v in parsed]
    assert judge.unparsed == sum(v is None for v in parsed)
    assert not any(p.requires_grad for p in model.parameters()) and not model.training


def test_under_bf16_the_judge_is_stored_in_bf16(tmp_path):
    judge = build_judge(_rollout_section(_tiny_judge_dir(tmp_path)), torch.device("cpu"),
                        bf16=True)
    assert {p.dtype for p in judge.sampler.model.parameters()} == {torch.bfloat16}
    assert judge.sampler.bf16 and len(judge(PROMPTS, RESPONSES, LABELS)) == 4


class _Said:
    """A sampler that 'generates' given texts: the verdict-to-reward path without a model."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.device = tokenizer, texts, torch.device("cpu")

    def __call__(self, ids, mask, max_new_tokens, shared=None):
        rows = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in self.texts]
        width = max(len(r) for r in rows)
        out = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r)
        return SimpleNamespace(response_ids=out)


def test_verdicts_become_rewards_and_unparsed_ones_score_zero(tmp_path):
    judge = build_judge(_rollout_section(_tiny_judge_dir(tmp_path)), torch.device("cpu"),
                        bf16=False)
    judge.sampler = _Said(judge.tokenizer, ["Yes", "No.", "hmm", "Correct"])
    assert judge(PROMPTS, RESPONSES, LABELS) == [1.0, 0.0, 0.0, 1.0]
    assert judge.unparsed == 1


def test_a_long_judging_prompt_keeps_its_end_within_the_context_and_says_so(tmp_path, capsys):
    judge = build_judge(_rollout_section(_tiny_judge_dir(tmp_path)), torch.device("cpu"),
                        bf16=False)
    assert judge.max_prompt_tokens == 256 - 6
    assert len(judge(["x" * 1000], ["y" * 1000], ["z"])) == 1  # no position past the context
    assert ("warning: 1 of 1 judging prompts exceed the judge's context of 256 tokens with "
            "--genrm-max-response-len 6") in capsys.readouterr().err


@pytest.mark.parametrize("max_len", [64, 300])
def test_a_verdict_budget_the_judges_context_cannot_hold_is_one_line(tmp_path, max_len):
    # 300: the prompt budget went negative (IndexError); 64: the template's own 192 tokens
    # (the tiny tokenizer is one token per character) left no room for a sample
    with pytest.raises(InputError, match=rf"^--genrm-max-response-len {max_len}: with the "
                       r"judging prompt's own 192 tokens .* context of 256 tokens"):
        build_judge(_rollout_section(_tiny_judge_dir(tmp_path), max_len=max_len),
                    torch.device("cpu"), bf16=False)


def test_a_directory_that_is_not_a_loadable_model_names_the_flag(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(InputError, match=rf"^--genrm-model-path {broken}"):
        build_judge(_rollout_section(str(broken)), torch.device("cpu"), bf16=False)


def test_a_judge_is_reached_through_its_section_only_with_genrm():
    assert build_judge(RewardsSection(rm_type="math"), torch.device("cpu"), bf16=False) is None


@pytest.mark.parametrize("layout,shares", [("shared-prefix", True), ("packed", False),
                                           ("padded", False)])
def test_the_pass_layout_switches_the_judges_shared_prefixes(tmp_path, layout, shares):
    judge = build_judge(_rollout_section(_tiny_judge_dir(tmp_path)), torch.device("cpu"),
                        bf16=False, pass_layout=layout)
    assert judge.share_prefixes is shares


def test_the_judge_class_needs_no_loader(tmp_path):
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=3, num_hidden_layers=1)
    judge = GenerativeJudge(model, tok, eos_token_ids=[tok.eos_token_id], template="{response}",
                            max_new_tokens=2, bf16=False, device=torch.device("cpu"))
    assert len(judge(["p"], ["r"], [None])) == 1
