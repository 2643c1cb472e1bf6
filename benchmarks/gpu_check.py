"""The GPU path measured in one call: train a Qwen3-0.6B-shaped model, then race the decode.

Run by ``benchmarks/gpu_check.sh`` after the algorithm tests; on its own::

    python3 benchmarks/gpu_check.py                          # qwen3-0.6b on cuda (the check)
    python3 benchmarks/gpu_check.py --size tiny --device cpu # the same logic in seconds on a CPU

What it does, in a fresh ``--workdir``:

1. **Model.** A Qwen3 with the published Qwen3-0.6B shape (hidden 1024, 28 layers, 16 query
   and 8 key/value heads of 128, MLP 3072, vocabulary 151,936, tied embeddings, RoPE theta
   1e6) and random weights (``relax.tiny_model``, seed 1), with the built-in
   character tokenizer padded to the same vocabulary; nothing is downloaded. Saved in bf16 (the
   file is half the size; Relax loads fp32 master weights from it).
2. **Training.** ``relax train`` on it: REINFORCE++ (``--normalize-advantages --gamma 1.0
   --kl-coef 0.01 --kl-loss-type k1``, so each step has a reference pass), 64 prompts x 8
   samples, up to 1024 new tokens, the built-in ``copy`` prompts, ``--bf16``, one optimizer
   step per rollout step, ``--recompute-granularity full`` (``--recompute none`` keeps the
   activations instead). Random weights over 151,936 tokens almost never sample EOS, so the
   responses run to the limit: the step is the full 512 x 1024 tokens. Printed: step time
   (median of the steps after the first, which pays for kernel set-up), the phase split,
   generated tokens/s, ``perf/mfu``, ``perf/update_mfu``, ``perf/log_prob_mfu``,
   ``perf/generate_bandwidth_fraction``, the measured peak and the peak memory (GPU memory
   allocated on CUDA; the process's RSS on the CPU).
3. **Decode.** The same batch (the same prompts x samples and new tokens) sampled once by
   Relax's ``generate`` (the rollout path of step 2) and once by transformers' ``generate``
   with ``cache_implementation="static"``, the model in bf16 on both sides, after a short
   warm-up of each; printed as seconds, tokens/s and the ratio. transformers would compile
   its static-cache decode step on CUDA by itself; that is switched off (eager against eager)
   unless ``--hf-compile``, whose compilation costs minutes of the budget.
4. **Packing.** The packed, prefix-shared log-prob and gradient passes (the training
   default) against the padded ones on the device, on a small Qwen3 (``compare_packing``).

Each phase is bounded (``--train-timeout``; the shell script bounds the whole). Exit status
0 when every phase ran, 1 when one failed; the summary goes to ``WORKDIR/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the checkout's relax, installed or not (and ahead of another installed copy): the check
# is of this tree, and the GPU machine runs it without installing anything
sys.path.insert(0, REPO)
# Qwen3-0.6B's published configuration (the fields that shape compute and memory)
QWEN3_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)
SIZES = {
    "qwen3-0.6b": dict(model=QWEN3_0_6B, vocab=151_936, prompts=64, samples=8,
                       new_tokens=1024, micro_batch=16, steps=3),
    # the CPU mode of the test suite: the same code paths in a few seconds
    "tiny": dict(model=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            max_position_embeddings=256, tie_word_embeddings=True),
                 vocab=1024, prompts=2, samples=4, new_tokens=8, micro_batch=8, steps=2),
}
PHASES = ("generate", "reward", "log_prob", "advantage", "update")
RATIOS = ("mfu", "update_mfu", "log_prob_mfu", "generate_bandwidth_fraction")


def say(text: str) -> None:
    print(f"gpu_check: {text}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(workdir: str, size: dict) -> str:
    """Save the random model and its tokenizer; returns the directory."""
    from relax.tiny_model import build_tiny_model, build_tokenizer

    path = os.path.join(workdir, "model")
    start = time.perf_counter()
    tokenizer = build_tokenizer(size["vocab"])
    model = build_tiny_model(tokenizer, seed=1, **size["model"])
    params = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    say(f"model: {params / 1e6:.0f}M parameters, vocabulary {len(tokenizer)}, built and saved "
        f"in {time.perf_counter() - start:.1f} s")
    return path


def train(args, size: dict, model_dir: str) -> dict:
    """``relax train`` in a child process; returns the figures read from its metrics.jsonl."""
    out = os.path.join(args.workdir, "run")
    cmd = [sys.executable, "-m", "relax", "train", "--hf-checkpoint", model_dir,
           "--builtin-task", "copy", "--advantage-estimator", "reinforce_plus_plus",
           "--normalize-advantages", "--gamma", "1.0", "--kl-coef", "0.01",
           "--kl-loss-type", "k1", "--rollout-batch-size", str(size["prompts"]),
           "--n-samples-per-prompt", str(size["samples"]),
           "--rollout-max-response-len", str(size["new_tokens"]),
           "--micro-batch-size", str(size["micro_batch"]), "--num-rollout", str(size["steps"]),
           "--lr", "1e-6", "--bf16", "--device", args.device, "--log-samples", "0",
           "--output-dir", out]
    if args.recompute:
        cmd += ["--recompute-granularity", args.recompute]
    say("train: " + " ".join(cmd[1:]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    start = time.perf_counter()
    # the child's output is passed through, so a failure shows its own message
    timed_out = None
    try:
        subprocess.run(cmd, check=True, env=env, timeout=args.train_timeout)
    except subprocess.TimeoutExpired as e:
        # one call of a lent GPU is all there is: report the steps that finished, then fail
        timed_out = e
    wall = time.perf_counter() - start
    metrics = os.path.join(out, "metrics.jsonl")
    rows = []
    if os.path.isfile(metrics):
        with open(metrics, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
    if not rows:
        raise timed_out or RuntimeError(f"no step was logged in {metrics}")
    if timed_out:
        say(f"train: stopped at the {args.train_timeout:.0f} s limit after {len(rows)} steps; "
            "their figures follow")
    later = rows[1:] or rows  # the first step pays for kernel selection and allocator growth

    def median(key):
        return statistics.median(r[key] for r in later if key in r) if key in later[0] else None

    result = {"wall_s": wall, "steps": len(rows), "recompute": args.recompute,
              "step_time_s": median("perf/step_time"),
              "phases_s": {p: median(f"perf/{p}_time") for p in PHASES},
              "generated_tokens_per_s": median("perf/generated_tokens_per_s"),
              "response_length": median("rollout/response_length"),
              **{k: median(f"perf/{k}") for k in RATIOS},
              "peak_tflops": median("perf/peak_tflops"),
              "bandwidth_gb_per_s": median("perf/bandwidth_gb_per_s"),
              "peak_memory_gb": max(r["perf/peak_memory_gb"] for r in rows)}
    memory = "GPU memory allocated" if args.device == "cuda" else "RSS of the process"
    phases = ", ".join(f"{p} {v:.2f}" for p, v in result["phases_s"].items() if v is not None)
    say(f"train: {len(rows)} steps in {wall:.1f} s (start-up included, recompute "
        f"{args.recompute or 'none'}); step time "
        f"{result['step_time_s']:.2f} s (median of steps 2..{len(rows)}); phases (s): {phases}")
    say(f"train: {result['generated_tokens_per_s']:.0f} generated tokens/s, mean response "
        f"{result['response_length']:.0f} tokens; " + ", ".join(
            f"{k} {result[k]:.3f}" for k in RATIOS if result[k] is not None)
        + f"; measured peak {result['peak_tflops']:.3g} TFLOP/s, copy bandwidth "
        f"{result['bandwidth_gb_per_s']:.0f} GB/s; peak {memory} {result['peak_memory_gb']:.2f} GiB")
    if timed_out:
        raise timed_out
    return result


def decode_batch(tokenizer, size: dict, device: torch.device):
    """The training step's batch shape: ``prompts`` copy-task prompts, each ``samples`` times,
    left-padded as Relax's rollout pads them."""
    from relax.rollout.generation.generate import tokenize_prompts
    from relax.rollout.prompts.tasks import CopyTask

    rng, task = random.Random(0), CopyTask()
    texts = [task.sample(rng)[0] for _ in range(size["prompts"])]
    ids, mask = tokenize_prompts(tokenizer, texts, device)
    return (ids.repeat_interleave(size["samples"], 0),
            mask.repeat_interleave(size["samples"], 0))


def timed(fn, device: torch.device) -> tuple[float, float | None, object]:
    """(seconds, peak GPU memory in GiB or None on the CPU, result) of one call."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return seconds, peak, result


def compare_decode(args, size: dict, model_dir: str) -> dict:
    """Relax's ``generate`` against transformers' static-cache ``generate`` on one batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax.precision import autocast
    from relax.rollout.generation.generate import generate

    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    model.eval()
    ids, mask = decode_batch(tokenizer, size, device)
    new = size["new_tokens"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def relax_decode(tokens):
        with autocast(device, True):
            out = generate(model, ids, mask, max_new_tokens=tokens, eos_token_ids=[eos],
                           pad_token_id=pad, temperature=1.0)
        return int(out.response_mask.sum())

    def hf_decode(tokens):
        with autocast(device, True), torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask.long(),
                                 max_new_tokens=tokens, do_sample=True, temperature=1.0,
                                 top_p=1.0, top_k=0, cache_implementation="static",
                                 disable_compile=not args.hf_compile, eos_token_id=eos,
                                 pad_token_id=pad)
        generated = out[:, ids.shape[1]:]
        # tokens up to and including each row's first EOS, as Relax counts them
        after_eos = (generated == eos).long().cumsum(-1) - (generated == eos).long()
        return int((after_eos == 0).sum())

    # a short warm-up of each (kernel selection, cuBLAS handles); with --hf-compile the
    # warm-up must have the timed shape, or the compiled step would be compiled again
    relax_decode(min(4, new))
    hf_decode(new if args.hf_compile else min(4, new))
    rows = {}
    for name, fn in (("relax", relax_decode), ("transformers", hf_decode)):
        seconds, peak, tokens = timed(lambda fn=fn: fn(new), device)
        rows[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                      "peak_memory_gb": peak}
        memory = f", peak GPU memory {peak:.2f} GiB" if peak is not None else ""
        say(f"decode {name}: {ids.shape[0]} rows x {new} new tokens: {seconds:.2f} s, "
            f"{tokens} tokens, {tokens / seconds:.0f} tokens/s{memory}")
    ratio = rows["transformers"]["seconds"] / rows["relax"]["seconds"]
    how = "compiled" if args.hf_compile else "eager"
    say(f"decode: transformers generate (static cache, {how}) / Relax generate time = "
        f"{ratio:.2f} (above 1: Relax is faster)")
    return {**rows, "ratio_transformers_over_relax": ratio, "hf_compile": args.hf_compile}


def compare_packing(args, size: dict, model_dir: str) -> dict:
    """The packed, prefix-shared passes on the device against the padded ones
    (relax/trainer/policy/packing.py): a small Qwen3 in fp32, four prompts of up to 24 tokens x four
    responses of 1..32 tokens; the largest log-prob difference and the largest gradient
    difference relative to the gradient's scale. A ValueError when they are not float rounding
    (the CPU's float64 tests hold them to 1e-10)."""
    from relax.tiny_model import build_tiny_model, build_tokenizer
    from relax.trainer.policy.experience import Experience
    from relax.trainer.policy.logprobs import response_log_probs

    device = torch.device(args.device)
    model = build_tiny_model(build_tokenizer(), seed=2, hidden_size=256, intermediate_size=512,
                             num_hidden_layers=4, head_dim=64).to(device)
    g = torch.Generator().manual_seed(0)
    P, T, rows = 24, 32, 16
    ids = torch.zeros(rows, P + T, dtype=torch.long)
    attention = torch.zeros(rows, P + T, dtype=torch.long)
    for i in range(rows):
        if i % 4 == 0:
            lp = int(torch.randint(4, P + 1, (1,), generator=g))
            prompt = torch.randint(3, model.config.vocab_size, (lp,), generator=g)
        lr = int(torch.randint(1, T + 1, (1,), generator=g))
        ids[i, P - lp:P] = prompt
        ids[i, P:P + lr] = torch.randint(3, model.config.vocab_size, (lr,), generator=g)
        attention[i, P - lp:P + lr] = 1
    exp = Experience(ids.to(device), attention.to(device),
                     (attention.cumsum(-1) - 1).clamp(min=0).to(device),
                     attention[:, P:].bool().to(device))
    out = {}
    for layout in ("padded", "shared-prefix"):
        model.zero_grad(set_to_none=True)
        logp, _ = response_log_probs(model, exp, layout=layout)
        (logp * exp.response_mask).sum().backward()
        out[layout] = (logp.detach(), [p.grad.clone() for p in model.parameters()])
    (ref, ref_grads), (got, got_grads) = out["padded"], out["shared-prefix"]
    m = exp.response_mask
    logp_diff = float((got - ref)[m].abs().max())
    grad_diff = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
                    for a, b in zip(got_grads, ref_grads, strict=True))
    say(f"packing: log-prob max |diff| {logp_diff:.2e}, gradient max relative diff "
        f"{grad_diff:.2e}")
    if not (logp_diff < 1e-3 and grad_diff < 1e-2):  # TF32 / reduced-precision kernels
        raise ValueError(f"packed passes differ from padded: log-prob {logp_diff:.2e}, "
                         f"gradient {grad_diff:.2e}")
    return {"logprob_max_abs_diff": logp_diff, "grad_max_rel_diff": grad_diff}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=list(SIZES), default="qwen3-0.6b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--workdir", default=None, help="default: a new temporary directory")
    p.add_argument("--steps", type=int, default=None, help="rollout steps (default: per size)")
    p.add_argument("--train-timeout", type=float, default=300.0,
                   help="seconds the training run may take (default 300)")
    p.add_argument("--recompute", choices=("full", "none"), default="full",
                   help="--recompute-granularity of the training run (default full: every "
                        "decoder layer recomputed in the backward; none measures "
                        "the same step keeping the activations)")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--skip-packing", action="store_true")
    p.add_argument("--hf-compile", action="store_true",
                   help="let transformers compile its static-cache decode step (minutes)")
    args = p.parse_args(argv)
    args.recompute = None if args.recompute == "none" else args.recompute
    if args.device == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        say(f"no CUDA device visible (torch {torch.__version__} is {build}); run with a GPU, "
            "or --device cpu --size tiny to check the logic")
        return 2
    size = dict(SIZES[args.size])
    if args.steps:
        size["steps"] = args.steps
    if args.workdir is None:
        import tempfile

        args.workdir = tempfile.mkdtemp(prefix="relax-gpu-check-")
    else:
        shutil.rmtree(args.workdir, ignore_errors=True)
        os.makedirs(args.workdir)
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    say(f"{args.size} on {where}, torch {torch.__version__}, workdir {args.workdir}")
    summary, failed = {"size": args.size, "device": where}, []
    model_dir = build_model(args.workdir, size)
    phases = [("train", train), ("decode", compare_decode), ("packing", compare_packing)]
    for name, fn in phases:
        if getattr(args, f"skip_{name}"):
            continue
        try:
            summary[name] = fn(args, size, model_dir)
        except (subprocess.SubprocessError, OSError, RuntimeError, ValueError) as e:
            detail = (f"timed out after {e.timeout:.0f} s"
                      if isinstance(e, subprocess.TimeoutExpired)
                      else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            summary[name] = {"error": detail}
            # one phase failing (a timeout, an out-of-memory) still lets the next one report
            say(f"{name} FAILED: {detail}")
            failed.append(name)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(args.workdir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    say(f"summary in {os.path.join(args.workdir, 'summary.json')}; "
        + (f"FAILED: {', '.join(failed)}" if failed else "all phases ran"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
