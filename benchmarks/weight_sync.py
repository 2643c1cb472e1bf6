"""The vLLM weight sync, disk against streamed (``--vllm-weight-sync disk|collective``), on one
owned server: K pushes of each, alternating (disk, collective, disk, ...), the median
seconds of a push and its GB/s (model bytes over seconds), as JSON.

Not part of the test suite. One server (``make vllm``'s environment with Relax's plugin),
started with the streamed engine so that both syncs run against it::

    .venv/bin/python benchmarks/weight_sync.py --model tiny --pushes 4
    .venv/bin/python benchmarks/weight_sync.py --model models/SmolLM2-135M-Instruct --out sync.json
    .venv/bin/python benchmarks/weight_sync.py --model qwen3-0.6b-shape   # random weights

``--model``: a Hugging Face directory, ``tiny`` (the test suite's 32-wide tiny Qwen3) or
``qwen3-0.6b-shape`` (Qwen3-0.6B's shape, hidden 1024, 28 layers, heads 16/8, intermediate
3072, vocab 151936, random weights built here). Each push sends weights that differ from
the served ones (a small perturbation per push), and the server's log-probs are not read:
correctness is the test suite's (tests/rollout/backends/vllm/test_vllm_server.py).

``--profile``: then one more push of each, every step timed on the trainer's clock (the
server is on the same host): per bucket the pack, the broadcast (until the bytes are sent)
and the server's answer (received and loaded), the control routes, the disk sync's write
and reload; and the server's own seconds per weight transfer route (vLLM's
``vllm:rl_weight_update_operation_duration_seconds`` from ``/metrics``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relax.rollout.backends.vllm import vllm_collective  # noqa: E402
from relax.rollout.backends.vllm.vllm_collective import ENGINE, CollectiveSync  # noqa: E402
from relax.rollout.backends.vllm.vllm_server import VllmServer, vllm_python  # noqa: E402
from relax.rollout.backends.vllm.vllm_sync import DiskSync, write_weights  # noqa: E402


def build(name: str, folder: Path):
    """The model and the directory holding its tokenizer."""
    from transformers import AutoModelForCausalLM

    if name == "tiny":
        from relax.tiny_model import build_tiny_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, seed=0, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=32)
    elif name == "qwen3-0.6b-shape":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        from relax.tiny_model import build_tokenizer

        tokenizer = build_tokenizer()
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(
            hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
            tie_word_embeddings=True, max_position_embeddings=4096,
            # a config built in code names no architecture, and vLLM then serves the
            # directory as an embedding model (Qwen3Model): say it is the causal LM
            architectures=["Qwen3ForCausalLM"]))
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        return model, name
    tokenizer.save_pretrained(folder / "tokenizer")
    return model, str(folder / "tokenizer")


TIMED = ("pause", "start_weight_update", "update_weights", "finish_weight_update", "resume",
         "set_weight_version", "weight_version", "reload_weights")


def server_seconds(client) -> dict[str, float]:
    """vLLM's summed seconds per weight transfer route so far (its Prometheus ``/metrics``)."""
    from relax import http_post

    text = http_post.request("GET", client.url + "/metrics", None, limit=60,
                             max_bytes=64 << 20).body.decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("vllm:rl_weight_update_operation_duration_seconds_sum"):
            operation = line.split('operation="')[1].split('"')[0]
            out[operation] = out.get(operation, 0.0) + float(line.split()[-1])
    return out


def profile(sync, client, model, version: int) -> dict:
    """One push of ``sync`` with every step timed (seconds from the push's start)."""
    events, origin = [], [0.0]

    def timed(name, fn):
        def call(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                events.append((name, start - origin[0], time.perf_counter() - origin[0]))
        return call

    saved = {name: getattr(client, name) for name in TIMED}
    for name, fn in saved.items():
        setattr(client, name, timed(name, fn))
    patched = [(vllm_collective, "pack"), (sync, "_send_chunk"), (sync, "write")]
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr in patched
                 if hasattr(owner, attr)]
    for owner, attr, fn in originals:
        setattr(owner, attr, timed(attr.strip("_"), fn))
    before = server_seconds(client)
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    origin[0] = time.perf_counter()
    try:
        sync.push(model, version)
        total = time.perf_counter() - origin[0]
    finally:
        for name, fn in saved.items():
            setattr(client, name, fn)
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)
    after = server_seconds(client)
    sums = {}
    for name, start, end in events:
        sums[name] = sums.get(name, 0.0) + end - start
    return {"total_s": total, "summed_s": sums,
            "server_summed_s": {k: after[k] - before.get(k, 0.0) for k in after},
            "events": [(n, round(a, 4), round(b, 4)) for n, a, b in sorted(events,
                                                                           key=lambda e: e[1])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--pushes", type=int, default=4, help="of each sync (K)")
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--profile", action="store_true", help="then one timed push of each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relax-sync-bench-") as tmp:
        tmp = Path(tmp)
        model, tokenizer = build(args.model, tmp)
        write_weights(model, str(tmp / "served"))
        server = VllmServer.start(str(tmp / "served"), tokenizer=tokenizer,
                                  log_path=str(tmp / "server.log"), dtype="float32", seed=0,
                                  logprobs_mode="raw_logprobs", python=vllm_python(),
                                  weight_transfer=ENGINE)
        try:
            server.wait_ready(1200)
            client = server.client(timeout=1200)
            client.served_model()
            disk = DiskSync(client, str(tmp / "weights"))
            syncs = {"disk": disk, "collective": CollectiveSync(
                disk.pool, timeout=1200, bucket_bytes=int(args.bucket_mb * 2**20))}
            seconds = {name: [] for name in syncs}
            nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            version = 0
            for _ in range(args.pushes):
                for name, sync in syncs.items():
                    version += 1
                    with torch.no_grad():
                        next(model.parameters()).add_(1e-3)
                    start = time.perf_counter()
                    sync.push(model, version)
                    seconds[name].append(time.perf_counter() - start)
                    print(f"{name} push {version}: {seconds[name][-1]:.2f} s", flush=True)
            if args.profile:
                profiled = {name: profile(sync, client, model, version + 1 + k)
                            for k, (name, sync) in enumerate(syncs.items())}
        finally:
            server.close()
    result = {"model": args.model, "bytes": nbytes, "pushes": args.pushes,
              "bucket_mb": args.bucket_mb, "threads": torch.get_num_threads(),
              **({"profile": profiled} if args.profile else {}),
              **{name: {"median_s": statistics.median(s),
                        "gb_per_s": nbytes / statistics.median(s) / 1e9, "seconds": s}
                 for name, s in seconds.items()}}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
