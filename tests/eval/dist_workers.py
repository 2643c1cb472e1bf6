"""Workers for the two-process evaluation test (kept out of test files so children stay light)."""

from __future__ import annotations


def parity_reward(prompts, responses, labels):
    """Deterministic with a mix of passing and failing prompts (the untrained greedy model
    answers every prompt alike): even-length labels pass, plus the response length / 100 so
    the mean reward also depends on what was generated."""
    return [float(len(y) % 2 == 0) + len(r) / 100 for r, y in zip(responses, labels, strict=True)]


def evaluate_on_rank(n_prompts: int) -> tuple[dict[str, float], dict[str, float]]:
    """The metrics without and with ``sync_group`` (FSDP-style lockstep decoding)."""
    import torch.distributed as dist

    from relax.eval.evaluate import evaluate
    from relax.tiny_model import build_tiny_model, build_tokenizer
    from tests.eval.conftest import copy_prompts
    from tests.eval.helpers import eval_sampling

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=3)
    prompts, labels = copy_prompts(n_prompts)
    group = dist.group.WORLD
    sampling = eval_sampling(n_samples=2, temperature=0.0, max_response_len=6, batch_size=4)
    return tuple(evaluate(model, tokenizer, prompts, labels, parity_reward, sampling,
                          name="copy", group=group, sync_group=group if sync else None)
                 for sync in (False, True))
