"""Candidate levers for the h256 + KL row of the TRL comparison, measured side by side.

    .venv/bin/python benchmarks/layer_levers.py [--repeats 6] [--skip-compile]

On the h256 model of ``compare_trl.py`` (hidden 256 / 4 layers, fp32, two threads) each lever
is timed against the current code in one process, alternating A, B, A, B; printed are the
medians and the B/A ratio (docs/performance.md, "Why h256 kl misses"):

- ``rmsnorm``: the Hugging Face RMSNorm module (five element-wise ops) vs one ``F.rms_norm``
  kernel, in a reference-style forward (64 rows, inference mode) and in a training forward +
  backward (32 rows); the forward outputs are compared too;
- ``compile``: the training forward + backward eager vs ``torch.compile(dynamic=False)``
  (compilation time printed separately; needs a C++ compiler).

The decode's thread wait policy (``OMP_WAIT_POLICY=ACTIVE``) has to be set before the OpenMP
runtime loads, so it is measured by ``--decode`` runs in separate processes, e.g.
``OMP_WAIT_POLICY=ACTIVE .venv/bin/python benchmarks/layer_levers.py --decode``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.compare_trl import MODEL_SEED, SIZES  # noqa: E402
from relax.tiny_model import build_tiny_model, build_tokenizer  # noqa: E402

ROWS, PROMPT, NEW = 64, 5, 32  # a rollout of compare_trl.py: 64 samples, <= 5 + 32 tokens


def timed(fn, calls: int = 5) -> float:
    fn()  # warm
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def side_by_side(name: str, a, b, repeats: int) -> None:
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(timed(a))
        tb.append(timed(b))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{name:<34} A {1000 * ma:7.1f} ms   B {1000 * mb:7.1f} ms   B/A {mb / ma:.2f}",
          flush=True)


def fused_rms_forward(self, x):
    # the same formula as the module: statistics in float32, the weight in the input dtype
    return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None,
                                    self.variance_epsilon).to(x.dtype)


def make_batch(vocab: int, rows: int):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, PROMPT + NEW), generator=gen)
    return ids, torch.ones_like(ids)


def train_step(model, ids, mask) -> None:
    logits = model(input_ids=ids, attention_mask=mask).logits[:, PROMPT - 1:-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, PROMPT:, None])
    logp.mean().backward()
    for p in model.parameters():
        p.grad = None


@contextlib.contextmanager
def norm_forward(norm_cls, fused: bool):
    """The RMSNorm class's forward swapped for the fused one (or kept) inside the block."""
    module_forward = norm_cls.forward
    norm_cls.forward = fused_rms_forward if fused else module_forward
    try:
        yield
    finally:
        norm_cls.forward = module_forward


def rmsnorm(model, tok, repeats: int) -> None:
    norm_cls = type(next(m for m in model.modules() if type(m).__name__.endswith("RMSNorm")))
    ref_ids, ref_mask = make_batch(len(tok), ROWS)
    ids, mask = make_batch(len(tok), ROWS // 2)

    def reference():
        with torch.inference_mode():
            return model(input_ids=ref_ids, attention_mask=ref_mask).logits

    def step():
        train_step(model, ids, mask)

    def under(fused, fn):
        def call():
            with norm_forward(norm_cls, fused):
                return fn()
        return call

    side_by_side("rmsnorm: reference forward, 64 rows", under(False, reference),
                 under(True, reference), repeats)
    side_by_side("rmsnorm: train fwd+bwd, 32 rows", under(False, step), under(True, step),
                 repeats)
    difference = (under(False, reference)() - under(True, reference)()).abs().max().item()
    print(f"rmsnorm: max |logit difference| {difference:.3g}")


def compiled(model, tok, repeats: int) -> None:
    ids, mask = make_batch(len(tok), ROWS // 2)
    start = time.perf_counter()
    fast = torch.compile(model, dynamic=False)
    train_step(fast, ids, mask)
    print(f"compile: first call (compilation) {time.perf_counter() - start:.1f} s", flush=True)
    side_by_side("compile: train fwd+bwd, 32 rows", lambda: train_step(model, ids, mask),
                 lambda: train_step(fast, ids, mask), repeats)


def decode(model, tok, repeats: int) -> None:
    from relax.rollout.generation.generate import generate

    prompts = torch.randint(3, len(tok), (ROWS // 8, PROMPT)).repeat_interleave(8, 0)
    gen = torch.Generator().manual_seed(0)

    def rollout():  # no EOS in the vocabulary: every row decodes all NEW tokens
        generate(model, prompts, torch.ones_like(prompts, dtype=torch.bool),
                 max_new_tokens=NEW, eos_token_ids=[len(tok) + 1], pad_token_id=0,
                 temperature=1.0, generator=gen)

    times = [timed(rollout) for _ in range(repeats)]
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    print(f"decode, 64 rows x {NEW} tokens, OMP_WAIT_POLICY={policy}: median "
          f"{1000 * statistics.median(times):.1f} ms (min {1000 * min(times):.1f})")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--decode", action="store_true", help="only time the decode (see above)")
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=MODEL_SEED, **SIZES["h256"])
    if a.decode:
        decode(model.eval(), tok, a.repeats)
        return
    rmsnorm(model.train(), tok, a.repeats)
    if not a.skip_compile:
        compiled(model, tok, a.repeats)


if __name__ == "__main__":
    main()
