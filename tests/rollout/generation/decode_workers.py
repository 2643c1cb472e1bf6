"""Workers for the two-rank lockstep decode test (kept out of test files so children stay
light)."""

from __future__ import annotations


def decode_on_rank(lengths: list[int], engine: bool) -> tuple[int, list, list]:
    """This rank decodes ``lengths[rank]`` tokens with ``sync_group`` (as a sharded model's
    ranks do): (the model's forward calls, the tokens drawn, the tokens of the same decode
    alone, without the group). ``engine``: Relax's decode engine, else the model's own
    forward, which sharded (FSDP2) models use (and whose calls the count sees)."""
    import torch
    import torch.distributed as dist

    from relax.rollout.generation import generate as module
    from relax.tiny_model import build_tiny_model, build_tokenizer

    if not engine:
        module.unsupported_reason = lambda model: "sharded, as under FSDP2"
    generate = module.generate

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=3).eval()
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    ids = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]])
    mask = ids != 0
    limit = lengths[dist.get_rank()]

    def tokens(sync_group):
        g = torch.Generator().manual_seed(11)
        out = generate(model, ids, mask, max_new_tokens=limit, eos_token_ids=[1],
                       pad_token_id=0, temperature=1.5, generator=g, sync_group=sync_group)
        return [r[m].tolist() for r, m in zip(out.response_ids, out.response_mask, strict=True)]

    synced = tokens(dist.group.WORLD)
    forward_calls = calls[0]  # the synced decode's only
    return forward_calls, synced, tokens(None)
