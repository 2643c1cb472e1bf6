"""Token-budget micro-batches (``--use-dynamic-batch-size --max-tokens-per-gpu``): grouping,
trimming, and the one-step gradient, loss and metrics equal to fixed micro-batches."""

from __future__ import annotations

import copy

import pytest
import torch

from relax.errors import InputError
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext
from relax.trainer.policy.experience import budget_groups, micro_batches, split_to, trimmed
from relax.trainer.policy.logprobs import batched_log_probs, response_log_probs
from relax.trainer.policy.update import train_on_rollout
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import make_config, read_metrics, write_jsonl, write_reward
from tests.trainer.workers import B, fixed_experience, loss_settings_of

CTX = DistContext(0, 1, 0, torch.device("cpu"), None)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tokenizer(), seed=5)


def test_groups_fit_the_budget_longest_first():
    lengths = [9, 3, 10, 4, 4, 2]
    groups = budget_groups(lengths, 12, "--max-tokens-per-gpu")
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= 12
    assert groups[0] == [2]  # the longest row alone: 2 x 10 > 12
    with pytest.raises(InputError, match=r"--max-tokens-per-gpu 8: a row of this step has 10 "):
        budget_groups(lengths, 8, "--max-tokens-per-gpu")
    assert [len(g) for g in split_to([[0, 1, 2, 3], [4]], 3)] == [2, 2, 1]


def test_trimmed_micro_batch_gives_the_same_log_probs(model):
    exp = fixed_experience(model)
    full, _ = response_log_probs(model, exp)
    for index, mb in micro_batches(exp, size=B, max_tokens=14, flag="--max-tokens-per-gpu"):
        assert mb.input_ids.shape[1] <= exp.input_ids.shape[1]
        assert mb.attention_mask.numel() <= 14 * 2  # rows x widest row <= the budget
        lp, _ = response_log_probs(model, mb)
        mask = mb.response_mask
        want = full[index, : lp.shape[1]]
        torch.testing.assert_close(lp[mask], want[mask], atol=1e-5, rtol=1e-5)
    # the no-grad passes: same values at every valid position, 0 at the trimmed ones
    fixed = batched_log_probs(model, exp, micro_batch_size=2, temperature=1.0)
    budget = batched_log_probs(model, exp, micro_batch_size=2, temperature=1.0, max_tokens=14)
    m = exp.response_mask
    torch.testing.assert_close(budget[m], fixed[m], atol=1e-5, rtol=1e-5)
    assert trimmed(exp).input_ids.shape[1] <= exp.input_ids.shape[1]


@pytest.mark.parametrize("per_token", [False, True])
def test_one_step_gradient_equals_fixed_micro_batches(model, per_token):
    """Tolerance 1e-5: the same sums in another order, and attention over trimmed all-padding
    columns (exactly zero weight) removed. The padded layout, whose padding budgets cut (the
    packed layouts have none: tests/trainer/policy/test_packing.py)."""
    exp = fixed_experience(model)
    estimator = "grpo"
    results = []
    for max_tokens in (None, 14):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        s = loss_settings_of(advantage_estimator=estimator, use_kl_loss=True, kl_loss_type="k3",
                         kl_loss_coef=0.1, per_token=per_token, max_tokens=max_tokens,
                         layout="padded")
        (values,) = train_on_rollout(m, opt, exp, s, CTX, global_batch_size=B,
                                     micro_batch_size=2, clip_grad=1e9)
        results.append((values, [p.grad.clone() for p in m.parameters()]))
    (fixed, grads_fixed), (budget, grads_budget) = results
    for a, b in zip(grads_fixed, grads_budget, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for name in ("train/loss", "train/pg_loss", "train/kl_loss", "train/entropy"):
        assert budget[name] == pytest.approx(fixed[name], rel=1e-5, abs=1e-6)
    assert budget["perf/update_padding_fraction"] < fixed["perf/update_padding_fraction"]


def test_relax_train_with_token_budget(tmp_path):
    cfg = make_config("--use-dynamic-batch-size", "--max-tokens-per-gpu", "64",
                      "--log-probs-max-tokens-per-gpu", "128",
                      "--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages",
                      "--kl-coef", "0.01", "--num-steps-per-rollout", "2",
                      output_dir=tmp_path / "run")
    from relax.trainer.launch import run

    run(cfg, console=False)
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(0.0 <= r["perf/update_padding_fraction"] < 1.0 for r in rows)


@pytest.mark.subprocess
def test_fsdp_ranks_run_equally_many_budget_micro_batches(tmp_path):
    """Under FSDP2 every pass is a collective: ranks whose rows pack into different numbers of
    micro-batches split theirs until the counts agree (a hang would fail the bounded wait)."""
    out = tmp_path / "run"
    proc = torchrun_relax("--num-rollout", "2", "--rollout-batch-size", "4",
                          "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
                          "--num-steps-per-rollout", "2", "--use-dynamic-batch-size",
                          "--max-tokens-per-gpu", "24", "--fsdp", "--device", "cpu", "--output-dir",
                          str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["rollout/step"] for r in read_metrics(out)] == [1, 2]


def test_a_last_shorter_micro_batch_changes_nothing(model):
    """reinforce_plus_plus.md §7: every reduction divides by the optimizer step's global count,
    so 8 rows in micro-batches of 3, 3 and 2 give the gradient of one micro-batch of 8."""
    exp = fixed_experience(model)
    grads = []
    for size in (B, 3):
        m = copy.deepcopy(model)
        s = loss_settings_of(advantage_estimator="reinforce_plus_plus_baseline", use_kl_loss=True,
                         kl_loss_type="k2", kl_loss_coef=0.1)
        train_on_rollout(m, torch.optim.SGD(m.parameters(), lr=0.0), exp, s, CTX,
                         global_batch_size=B, micro_batch_size=size, clip_grad=1e9)
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    assert any(float(g.abs().max()) > 0 for g in grads[0])


def test_a_padding_heavy_step_names_token_budgets_once(capsys):
    from types import SimpleNamespace

    from relax.trainer.perf.step_metrics import PADDING_NOTE, StepMetrics

    metrics = StepMetrics.__new__(StepMetrics)
    metrics.ctx, metrics.padding_note = SimpleNamespace(is_main=True), True
    metrics._note_padding({"perf/update_padding_fraction": PADDING_NOTE})  # not above: quiet
    assert capsys.readouterr().err == ""
    metrics._note_padding({"perf/update_padding_fraction": 0.56})
    err = capsys.readouterr().err
    assert "56% of the update's token slots were padding" in err
    assert "--use-dynamic-batch-size --max-tokens-per-gpu N" in err
    metrics._note_padding({"perf/update_padding_fraction": 0.9})  # once per run
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("budget", [False, True])
def test_relax_train_notes_padding_only_with_fixed_micro_batches(tmp_path, capsys, budget):
    # one prompt of 120 characters among three of one: the short rows' micro-batch slots are
    # mostly the long prompt's padding (the tiny tokenizer has a token per character)
    data = write_jsonl(tmp_path, [{"input": "x" * n, "label": 1} for n in (120, 1, 1, 1)])
    flags = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "256"] if budget else []
    cfg = make_config(*flags, "--pass-layout", "padded", "--prompt-data", data, "--custom-rm-path",
                      write_reward(tmp_path) + ":parity", output_dir=tmp_path / "run")
    from relax.trainer.launch import run

    run(cfg, console=False)
    shares = [r["perf/update_padding_fraction"] for r in read_metrics(tmp_path / "run")]
    noted = capsys.readouterr().err.count("of the update's token slots were padding")
    if budget:
        assert noted == 0 and max(shares) < 0.5, shares
    else:
        assert noted == 1 and min(shares) > 0.5, shares  # two such steps, one note


def test_gradients_stay_allocated_and_equal_freed_ones(model):
    """update.py zeroes the gradients in place (their storage is reused from step to step,
    which keeps the host heap from fragmenting); the parameters after two AdamW steps are
    bitwise those of gradients freed and allocated again (``set_to_none=True``)."""
    exp = fixed_experience(model)
    s = loss_settings_of(advantage_estimator="grpo", use_kl_loss=True, kl_loss_type="k3",
                         kl_loss_coef=0.1)
    params = []
    for set_to_none in (False, True):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
        if set_to_none:  # the reference: what zero_grad(set_to_none=True) did before
            zero = opt.zero_grad
            opt.zero_grad = lambda set_to_none=True, zero=zero: zero(set_to_none=True)
        storage = None
        for _ in range(2):
            train_on_rollout(m, opt, exp, s, CTX, global_batch_size=B // 2, micro_batch_size=2,
                             clip_grad=1.0)
            pointers = [p.grad.data_ptr() for p in m.parameters()]
            if not set_to_none:
                assert storage in (None, pointers)  # the same buffers in every step
            storage = pointers
        params.append([p.detach().clone() for p in m.parameters()])
    for kept, freed in zip(*params, strict=True):
        assert torch.equal(kept, freed)
