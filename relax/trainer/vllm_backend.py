"""``--rollout-backend vllm`` assembled for one rank: its server (started and owned, or named
by ``--vllm-url``), the sampler the collectors call and the weight sync after updates.

    backend = VllmBackend.open(cfg, ctx, bf16=False)   # before any model loads
    backend.ready()                                    # the server answers and can sample
    sampler = backend.sampler(params, eos_token_ids=eos, pad_token_id=pad)
    backend.after_update(module, version, tracker)     # every --update-weights-interval steps
    backend.close()                                    # an owned server is gone

Rank r owns one server (its log ``OUTPUT_DIR/vllm-rank<r>.log``, its weights
``OUTPUT_DIR/vllm-weights-rank<r>/``) or uses ``--vllm-url`` entry r mod their number. The
server starts while the trainer loads its model; :meth:`ready` then waits for it (at most
``--vllm-startup-timeout``) and samples one token, so a model the server cannot run stops
the run with one line before training instead of at the first rollout.
"""

from __future__ import annotations

import os

from relax.config.rollout_backend import log_probs_mode
from relax.errors import InputError
from relax.rollout.sampler import SamplingParams
from relax.rollout.vllm_sampler import VllmSampler
from relax.rollout.vllm_server import (
    ServerError,
    VllmClient,
    VllmServer,
    check_version,
    healthy,
    installed_version,
    vllm_python,
)
from relax.trainer.vllm_sync import DiskSync


class VllmBackend:
    def __init__(self, cfg, ctx, client: VllmClient, server: VllmServer | None):
        self.cfg, self.ctx, self.client, self.server = cfg, ctx, client, server
        self.sync = DiskSync(client, os.path.join(cfg.output_dir,
                                                  f"vllm-weights-rank{ctx.rank}"))
        self.samplers: list[VllmSampler] = []
        self.version = 0  # the trainer steps behind the server's weights

    @classmethod
    def open(cls, cfg, ctx, *, bf16: bool) -> VllmBackend:
        """Check a ``--vllm-url`` server (exit 2 when it does not answer) or start one."""
        if cfg.vllm_url:
            url = cfg.vllm_url[ctx.rank % len(cfg.vllm_url)]
            if not healthy(url):
                raise InputError(f"--vllm-url {url}: no vLLM server answers there (GET "
                                 "/health); start it or correct the URL")
            client = VllmClient(url, timeout=cfg.vllm_request_timeout)
            check_version(client.version(), f"--vllm-url {url}")
            return cls(cfg, ctx, client, None)
        python = vllm_python()
        installed_version(python)
        server = VllmServer.start(
            os.path.abspath(cfg.hf_checkpoint),
            log_path=os.path.join(cfg.output_dir, f"vllm-rank{ctx.rank}.log"),
            dtype="bfloat16" if bf16 else "float32", seed=cfg.seed,
            logprobs_mode=log_probs_mode(cfg.rollout_temperature), python=python)
        return cls(cfg, ctx, server.client(cfg.vllm_request_timeout), server)

    def ready(self) -> None:
        """The server answers, serves --hf-checkpoint and samples a token (else exit 2)."""
        if self.server is not None:
            self.server.wait_ready(self.cfg.vllm_startup_timeout)
        served = self.client.served_model()
        want = os.path.realpath(self.cfg.hf_checkpoint)
        if os.path.realpath(str(served.get("root") or served["id"])) != want:
            raise InputError(f"{self.client.describe()} serves {served.get('root')!r}, not "
                             f"--hf-checkpoint {self.cfg.hf_checkpoint}; start it on that "
                             "model or correct the URL")
        try:
            self.client.complete([0], max_tokens=1, temperature=1.0, top_p=1.0, top_k=-1,
                                 seed=0, stop_token_ids=[])
        except ServerError as e:
            raise InputError(f"the model --hf-checkpoint {self.cfg.hf_checkpoint} does not "
                             f"run on vLLM: {e}") from e

    def sampler(self, params: SamplingParams, *, eos_token_ids: list[int],
                pad_token_id: int) -> VllmSampler:
        s = VllmSampler(self.client, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                        params=params, device=self.ctx.device, version=self.version)
        self.samplers.append(s)
        return s

    def due(self, version: int) -> bool:
        """Whether the weights after ``version`` steps go to the server (every
        ``--update-weights-interval`` steps)."""
        return version % self.cfg.update_weights_interval == 0

    def push(self, module, version: int, tracker) -> None:
        """The server samples with ``module``'s weights (``version``) from now on."""
        nbytes = self.sync.push(module, version)
        self.version = version
        for s in self.samplers:
            s.version = version
        tracker.add_max("vllm/weight_sync_bytes", nbytes)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
