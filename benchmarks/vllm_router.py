"""Sampling time of a step on a long tail: two ranks each pinned to its own vLLM server,
against the same two servers in one pool behind the router (relax/rollout/backends/vllm/router.py).

Two owned servers of ``--model`` (``--threads`` OpenMP threads each, unbound) serve two
"ranks" (threads of this process, as the ranks of a colocated run are processes: each has a
pool of its own). A step gives each rank ``--requests`` completions whose lengths come from a
long tail (``--short`` tokens for most, ``--long`` for a share ``--tail``, drawn per step and
rank from ``--seed``; ``ignore_eos``, so a request's length is what was drawn): the step ends
when both ranks have their answers, as a training step waits for its slowest rank.

- **pinned**: rank r's pool holds server r only (one server per rank, the layout before the
  router: a rank with more long requests holds the step while the other server idles);
- **router**: each rank's pool holds both servers (``--vllm-num-servers 2`` with two ranks):
  each request goes to the server with the fewest of the rank's requests in flight.

The two layouts run the same step's draws one after the other, alternating which goes first
(A, B then B, A), after one warm-up step each; the medians over ``--steps`` steps are printed
as one JSON object with every step's seconds and tokens.

    python benchmarks/vllm_router.py --model /work/models/SmolLM2-135M-Instruct --steps 6

Never run by the test suite; needs ``make vllm``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time

from relax.rollout.backends.vllm.router import ServerPool
from relax.rollout.backends.vllm.vllm_answers import completion
from relax.rollout.backends.vllm.vllm_client import VllmClient
from relax.rollout.backends.vllm.vllm_server import VllmServer


class _FixedLength(VllmClient):
    """A client whose completions run to ``max_tokens`` (``ignore_eos``), so a request's
    length is the workload's draw, not the model's choice."""

    def complete(self, prompt, *, max_tokens, seed, **_):
        body = {"model": self.model, "prompt": [prompt], "max_tokens": max_tokens,
                "temperature": 1.0, "seed": seed, "logprobs": 0, "return_token_ids": True,
                "ignore_eos": True}
        return completion(self.request("/v1/completions", body), max_tokens=max_tokens)


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads per server")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--requests", type=int, default=16, help="per rank and step")
    parser.add_argument("--short", type=int, default=24)
    parser.add_argument("--long", type=int, default=192)
    parser.add_argument("--tail", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def _draws(args, step: int) -> list[list[int]]:
    """Each rank's request lengths at ``step``."""
    rng = random.Random(args.seed * 1000 + step)
    return [[args.long if rng.random() < args.tail else args.short
             for _ in range(args.requests)] for _ in range(2)]


def _rank(pool: ServerPool, lengths: list[int], prompt: list[int], seed: int) -> None:
    threads = [threading.Thread(target=pool.complete, args=(prompt,),
                                kwargs={"max_tokens": n, "seed": seed + i})
               for i, n in enumerate(lengths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _step(pools: list[ServerPool], draws: list[list[int]], prompt: list[int], seed: int) -> float:
    start = time.perf_counter()
    ranks = [threading.Thread(target=_rank, args=(pool, lengths, prompt, seed))
             for pool, lengths in zip(pools, draws, strict=True)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join()
    return time.perf_counter() - start


def main() -> None:
    args = _parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the servers inherit it
    prompt = list(range(100, 140))  # 40 tokens: the length of a chat-templated sum
    with tempfile.TemporaryDirectory() as run_dir:
        servers = [VllmServer.start(args.model, log_path=os.path.join(run_dir, f"s{k}.log"),
                                    dtype="float32", seed=0, logprobs_mode="raw_logprobs",
                                    max_model_len=1024) for k in range(2)]
        try:
            started = time.perf_counter()
            for s in servers:
                s.wait_ready(timeout=900)
            startup = time.perf_counter() - started
            clients = [_FixedLength(s.url, timeout=900, server=s) for s in servers]
            for c in clients:
                c.served_model()
            layouts = {"pinned": [ServerPool([clients[0]], [0]), ServerPool([clients[1]], [1])],
                       "router": [ServerPool(clients, [0, 1]), ServerPool(clients, [0, 1])]}
            for pools in layouts.values():  # warm-up
                _step(pools, _draws(args, -1), prompt, 0)
            runs = {name: [] for name in layouts}
            tokens = []
            for step in range(args.steps):
                draws = _draws(args, step)
                tokens.append([sum(d) for d in draws])
                order = list(layouts) if step % 2 == 0 else list(reversed(layouts))
                for name in order:
                    runs[name].append(_step(layouts[name], draws, prompt, step * 100))
        finally:
            for s in servers:
                s.close()
    medians = {k: round(statistics.median(v), 2) for k, v in runs.items()}
    print(json.dumps({
        "model": args.model, "threads_per_server": args.threads, "steps": args.steps,
        "requests_per_rank": args.requests, "short": args.short, "long": args.long,
        "tail": args.tail, "server_startup_s": round(startup, 1),
        "step_s_median": medians,
        "router_over_pinned": round(medians["router"] / medians["pinned"], 3),
        "step_s": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "tokens_per_rank": tokens,
    }))


if __name__ == "__main__":
    main()
