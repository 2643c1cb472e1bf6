"""On-policy self-distillation on tiny models (reinforce_plus_plus.md §7b, "Self mode"): the
trainer's chunked, packed JSD against a float64 reference that runs each row unpadded through
both models; a run end to end (metrics, resume); bad data is one line."""

import math

import pytest
import torch

from relax.rollout.prompts.privileged import TEMPLATE, with_privileged
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer import train
from relax.trainer.policy.logprobs import response_rows
from tests.trainer.helpers import fit, make_config, read_metrics, write_jsonl, write_reward
from tests.trainer.workers import OPSD_CLIP, attach_self_distillation, fixed_experience

OPSD = ("train/opsd_jsd", "train/opsd_jsd_clipfrac", "train/opsd_reverse_kl",
        "train/opsd_teacher_logprob")


def _row_logits(model, prompt_ids, prompt_mask, response_ids, n):
    """Logits [n, V] predicting the first ``n`` response tokens of one row, run unpadded."""
    ids = torch.cat([prompt_ids[prompt_mask], response_ids[:n]])[None]
    logits = model(input_ids=ids, use_cache=False).logits[0]
    p = int(prompt_mask.sum())
    return logits[p - 1:p - 1 + n]


def _reference(student, teacher, exp, beta, clip):
    """Clipped JSD [B, T] (0 off the mask) and the teacher's log-prob of the sampled tokens,
    written with softmax as exp / sum, one unpadded row at a time."""
    B, T = exp.response_mask.shape
    P = exp.input_ids.shape[1] - T
    jsd, tlp = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, T, dtype=torch.float64)
    out = []
    for i in range(B):
        n = int(exp.attention_mask[i, P:].sum())
        if n == 0:
            continue
        resp = exp.input_ids[i, P:]
        s = _row_logits(student, exp.input_ids[i, :P], exp.attention_mask[i, :P].bool(), resp, n)
        with torch.no_grad():
            t = _row_logits(teacher, exp.teacher_prompt_ids[i], exp.teacher_prompt_mask[i],
                            resp, n)
        p, q = s.softmax(-1), t.softmax(-1)
        m = (1 - beta) * p + beta * q
        d = beta * (q * (q / m).log()).sum(-1) + (1 - beta) * (p * (p / m).log()).sum(-1)
        keep = exp.response_mask[i, :n]
        out.append(torch.where(keep, torch.clamp(d, max=clip), 0.0).sum())
        jsd[i, :n] = torch.where(keep, d.detach(), 0.0)
        tlp[i, :n] = torch.where(keep, q.gather(-1, resp[:n, None]).squeeze(-1).log(), 0.0)
    return torch.stack(out).sum(), jsd, tlp


@pytest.mark.parametrize("layout", ["padded", "shared-prefix"])
def test_chunked_jsd_matches_an_unpadded_float64_reference(layout):
    student = build_tiny_model(build_tokenizer(), seed=7).double()
    exp = fixed_experience(student.float())
    student.double()
    opsd = attach_self_distillation(exp)
    opsd.teacher.double()
    rows = response_rows(student, exp, layout=layout)
    got, stats = opsd.token_terms(rows, exp)
    want_sum, want_jsd, want_tlp = _reference(student, opsd.teacher, exp, 0.5, OPSD_CLIP)
    mask = exp.response_mask
    torch.testing.assert_close(stats[..., 0][mask], want_jsd[mask], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(stats[..., 3][mask], want_tlp[mask], rtol=1e-9, atol=1e-12)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))  # holes and padding
    assert 0 < int(stats[..., 1][mask].sum()) < int(mask.sum())  # the clip acts on some
    params = [p for p in student.parameters() if p.requires_grad]
    grads = torch.autograd.grad(got.sum(), params)
    want = torch.autograd.grad(want_sum, params)
    assert float(got.sum().detach()) == pytest.approx(float(want_sum.detach()), rel=1e-10)
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-12)


def test_the_teacher_prompt_template():
    assert with_privileged("2+2=", "4") == TEMPLATE.format(prompt="2+2=", privileged="4")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2"}]
    out = with_privileged(messages, "sol")
    assert out[3]["content"] == TEMPLATE.format(prompt="Q2", privileged="sol")
    assert out[:3] == messages[:3] and messages[3]["content"] == "Q2"  # a copy


def _data(tmp_path, rows=None):
    rows = rows or [{"input": f"{a}+{a}=", "label": str(2 * a), "solution": f"{a}+{a}={2 * a}"}
                    for a in range(8)]
    return write_jsonl(tmp_path, rows)


def _flags(tmp_path, data):
    reward = write_reward(tmp_path)
    return ["--prompt-data", data, "--custom-rm-path", f"{reward}:parity", "--use-opd",
            "--opd-type", "self", "--opsd-privileged-info-key", "solution", "--opd-only",
            "--lr", "1e-2", "--opsd-jsd-clip", "0.008", "--seed", "3"]


def test_a_self_distillation_run_trains_and_resumes_exactly(tmp_path):
    common = _flags(tmp_path, _data(tmp_path))
    _, full, moved = fit(make_config(*common, "--num-rollout", "2",
                                     output_dir=tmp_path / "full"))
    assert moved > 1e-4
    for row in read_metrics(tmp_path / "full"):
        assert all(math.isfinite(row[k]) for k in OPSD), row
        assert row["train/opsd_jsd"] > 0 and row["train/opsd_teacher_logprob"] < 0
        assert 0 <= row["train/opsd_jsd_clipfrac"] <= 1
        assert row["train/pg_loss"] == 0.0  # --opd-only: the JSD is the whole loss
    # the teacher is the built-in model rebuilt from the seed: a resumed run scores the same
    fit(make_config(*common, "--num-rollout", "1", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    trainer, tail, _ = fit(make_config(*common, "--num-rollout", "2", "--load",
                                       str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    assert trainer.start_step == 1 and len(tail) == 1
    for key in (*OPSD, "train/loss", "train/grad_norm"):
        assert tail[0][key] == pytest.approx(full[1][key], rel=1e-6, abs=1e-9), key


def test_a_row_without_the_privileged_key_is_one_line_exit_2(tmp_path, capsys):
    data = _data(tmp_path, [{"input": "1+1=", "label": "2", "solution": "2"},
                            {"input": "2+2=", "label": "4"}])
    assert train(make_config(*_flags(tmp_path, data), output_dir=tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{data}:2: missing key 'solution' (--opsd-privileged-info-key)" in err[0]


def test_token_budget_micro_batches_trim_the_teacher_prompt_on_its_own():
    from relax.trainer.policy.experience import trimmed

    model = build_tiny_model(build_tokenizer(), seed=7)
    exp = fixed_experience(model)
    opsd = attach_self_distillation(exp)
    rows = exp.select(torch.tensor([1, 7]))  # teacher prompts of 2 and 1 tokens out of 7
    cut = trimmed(rows)
    assert cut.teacher_prompt_ids.shape[1] == 2 and cut.teacher_prompt_mask[:, 0].any()
    assert cut.input_ids.shape[1] < rows.input_ids.shape[1]  # the student's trimmed too
    with torch.no_grad():
        want, _ = opsd.token_terms(response_rows(model, rows, layout="padded"), rows)
        got, _ = opsd.token_terms(response_rows(model, cut, layout="padded"), cut)
    torch.testing.assert_close(got, want[:, :got.shape[1]], rtol=1e-5, atol=1e-7)


def test_dynamic_sampling_keeps_each_kept_row_with_its_teacher_prompt():
    from relax.rollout.generation.batch import StepBatch, kept_batch
    from relax.rollout.generation.generate import Rollout

    def part(tag):
        r = Rollout(torch.tensor([[4, 5], [6, 7]]), torch.ones(2, 2, dtype=torch.bool),
                    torch.tensor([[8], [9]]), torch.ones(2, 1, dtype=torch.bool),
                    torch.tensor([False, False]))
        return StepBatch.of(prompts=[f"{tag}0", f"{tag}1"], labels=[0, 1],
                            group_index=torch.tensor([0, 1]), rollout=r, responses=["", ""],
                            rewards=torch.zeros(2), teacher_prompts=[f"T{tag}0", f"T{tag}1"])

    out = kept_batch([part("a"), part("b")], [(1, 0), (0, 1)], 1, pad_token_id=0)
    assert out.prompts == ["b0", "a1"] and out.teacher_prompts == ["Tb0", "Ta1"]


def test_the_output_layers_run_in_chunks_no_larger_than_the_bound(monkeypatch):
    """No [B, T, V] logits: each call of the JSD sees at most chunk_elements // V rows."""
    from relax.trainer.terms import self_distillation as self_distill

    seen = []
    original = self_distill.opsd_token_terms

    def spy(student_logits, teacher_logits, targets, **kw):
        seen.append((tuple(student_logits.shape), tuple(teacher_logits.shape)))
        return original(student_logits, teacher_logits, targets, **kw)

    monkeypatch.setattr(self_distill, "opsd_token_terms", spy)
    model = build_tiny_model(build_tokenizer(), seed=7)
    exp = fixed_experience(model)
    opsd = attach_self_distillation(exp)  # chunks of 5 rows
    got, _ = opsd.token_terms(response_rows(model, exp, layout="padded"), exp)
    got.sum().backward()  # the backward recomputes each chunk: same bound
    V = model.config.vocab_size
    assert len(seen) > 2 * 5 and {v for (_, v), _ in seen} == {V}
    assert max(n for (n, _), _ in seen) <= 5
    assert sum(n for (n, _), _ in seen) == 2 * int(exp.response_mask.sum())  # forward + recompute
