"""How a pack's attention runs fastest on this CPU: one SDPA per block against one SDPA over the
whole pack with a block-diagonal mask, and for a shared-prompt group one SDPA per response
(keys: prompt + itself) against one masked SDPA over the group. Forward + backward of the
attention alone at SmolLM2-135M's shapes (9 query heads, 3 key/value heads, head 64), times
30 layers, best of 5; fp32 and bf16 autocast. Not part of the test suite::

    .venv/bin/python benchmarks/packed_attention.py --threads 1

relax/trainer/policy/packing.py's ``block_attention`` is the per-block / per-response choice.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

F = torch.nn.functional
LAYERS, HQ, HKV, D = 30, 9, 3, 64


def _best(fn) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * LAYERS


def _qkv(n: int, dtype):
    return [torch.randn(1, h, n, D, dtype=dtype, requires_grad=True) for h in (HQ, HKV, HKV)]


def _sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)


def rows(lengths: list[int], dtype) -> tuple[float, float]:
    """(per-row SDPA, one block-diagonal SDPA) seconds for a pack of unshared rows."""
    q, k, v = _qkv(sum(lengths), dtype)
    bounds = torch.tensor([0, *lengths]).cumsum(0).tolist()
    mask = torch.block_diag(*[torch.ones(n, n, dtype=torch.bool).tril() for n in lengths])

    def per_row():
        torch.cat([_sdpa(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True)
                   for s, e in zip(bounds, bounds[1:], strict=False)], 2).sum().backward()

    def dense():
        _sdpa(q, k, v, attn_mask=mask).sum().backward()

    return _best(per_row), _best(dense)


def group(prompt: int, responses: list[int], dtype) -> tuple[float, float]:
    """(prompt + one SDPA per response, one masked SDPA over the group) seconds."""
    n = prompt + sum(responses)
    q, k, v = _qkv(n, dtype)
    segment = torch.repeat_interleave(torch.arange(len(responses) + 1),
                                      torch.tensor([prompt, *responses]))
    group_mask = (torch.ones(n, n, dtype=torch.bool).tril()
                  & ((segment[None] == 0) | (segment[None] == segment[:, None])))
    masks = [torch.cat([torch.ones(r, prompt, dtype=torch.bool),
                        torch.ones(r, r, dtype=torch.bool).tril()], 1) for r in responses]

    def split():
        out = [_sdpa(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], is_causal=True)]
        o = prompt
        for r, m in zip(responses, masks, strict=True):
            kk = torch.cat([k[:, :, :prompt], k[:, :, o:o + r]], 2)
            vv = torch.cat([v[:, :, :prompt], v[:, :, o:o + r]], 2)
            out.append(_sdpa(q[:, :, o:o + r], kk, vv, attn_mask=m))
            o += r
        torch.cat(out, 2).sum().backward()

    def dense():
        _sdpa(q, k, v, attn_mask=group_mask).sum().backward()

    return _best(split), _best(dense)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"threads {a.threads}, load {os.getloadavg()[0]:.2f}, torch {torch.__version__}")
    print("| dtype | pack | per block s | one masked SDPA s |")
    print("|---|---|---:|---:|")
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype is torch.bfloat16):
            for label, fn in (
                ("16 rows x 79 tokens", lambda d=dtype: rows([79] * 16, d)),
                ("4 groups: prompt 44 + 4 x 35", None),
                ("group: prompt 44 + 8 x 35", lambda d=dtype: group(44, [35] * 8, d)),
                ("group: prompt 44 + 8 x 400", lambda d=dtype: group(44, [400] * 8, d)),
            ):
                if fn is None:  # four groups, each its own block: 4 x one group's time
                    split, dense = (4 * x for x in group(44, [35] * 4, dtype))
                else:
                    split, dense = fn()
                print(f"| {name} | {label} | {split:.3f} | {dense:.3f} |", flush=True)


if __name__ == "__main__":
    main()
