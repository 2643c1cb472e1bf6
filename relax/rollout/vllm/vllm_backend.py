"""``--rollout-backend vllm`` assembled for one rank: its server (started and owned, or named
by ``--vllm-url``), the sampler the collectors call and the weight sync after updates; also
``relax eval --rollout-backend vllm``'s server.

    backend = VllmBackend.open(VllmSettings.of_train(cfg), rank, device, ctx)  # no model yet
    backend.start(module, bf16=False, lora=None)       # serving, answering, sampling
    sampler = backend.sampler(params, eos_token_ids=eos, pad_token_id=pad)
    if backend.due(version):                           # every --update-weights-interval steps
        backend.push(module, version, tracker)
    backend.close()                                    # an owned server is gone

Rank r owns one server (its log ``RUN_DIR/vllm-rank<r>.log``, its weights
``RUN_DIR/vllm-weights-rank<r>/``) or uses ``--vllm-url`` entry r mod their number (under
``--fully-async`` r is the world rank of a rollout rank, and rollout rank i of the
rollout ranks uses entry i: ``slot``). An
owned server starts once the model is loaded, from that model's weights written as ``v0``
(untied: relax/rollout/vllm/vllm_weights.py), so it samples exactly the trainer's weights. Under
FSDP2 rank 0 writes every version into ``RUN_DIR/vllm-weights/`` for all ranks' servers. A
LoRA run (``lora``: peft's tuner) serves --hf-checkpoint itself with ``--enable-lora`` and
loads the adapter by name after each update (vllm_sync.py ``LoraSync``).
:meth:`VllmBackend.start` waits for it (at most ``--vllm-startup-timeout``) and
samples one token, so a model the server cannot run stops the run with one line before
training instead of at the first rollout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from relax.config.sections.backend import log_probs_mode
from relax.errors import InputError
from relax.rollout.generation.sampler import SamplingParams
from relax.rollout.vllm.vllm_sampler import VllmSampler
from relax.rollout.vllm.vllm_server import (
    ServerError,
    VllmClient,
    VllmServer,
    connect,
    installed_version,
    vllm_python,
)
from relax.rollout.vllm.vllm_sync import DiskSync, LoraSync, Shards
from relax.rollout.vllm.vllm_weights import lora_rank_slot


@dataclass(frozen=True)
class VllmSettings:
    """What the backend reads of a command's configuration: ``urls`` (``--vllm-url``, None:
    owned servers), ``model_dir`` (the model and its tokenizer), ``run_dir`` (logs and weight
    directories), the sampling ``temperature`` (picks the log-prob mode) and the sync
    ``interval``."""

    urls: tuple[str, ...] | None
    model_dir: str
    run_dir: str
    seed: int
    temperature: float
    interval: int
    startup_timeout: float
    request_timeout: float
    fsdp: bool = False  # --fsdp: the sync gathers the shards (vllm_sync.py ``Shards``)
    bucket_bytes: int = 64 << 20  # --weight-sync-bucket-mb
    partial_chunk: int = 32  # --vllm-partial-chunk-tokens (vllm_sampler.py)

    @classmethod
    def of_train(cls, cfg) -> VllmSettings:
        return cls(urls=tuple(cfg.rollout.backend.vllm_url) if cfg.rollout.backend.vllm_url else None,
                   model_dir=cfg.model.hf_checkpoint, run_dir=cfg.run.output_dir, seed=cfg.run.seed,
                   temperature=cfg.rollout.sampling.temperature, interval=cfg.placement.update_weights_interval,
                   startup_timeout=cfg.rollout.backend.vllm_startup_timeout,
                   request_timeout=cfg.rollout.backend.vllm_request_timeout, fsdp=cfg.system.fsdp,
                   bucket_bytes=int(cfg.placement.weight_sync_bucket_mb * 2**20),
                   partial_chunk=cfg.rollout.backend.vllm_partial_chunk_tokens)

    @classmethod
    def of_eval(cls, cfg, run_dir: str) -> VllmSettings:
        """``relax eval``: the checkpoint's weights, no sync; no log-prob is read, so the
        mode is the raw one."""
        return cls(urls=tuple(cfg.rollout.backend.vllm_url) if cfg.rollout.backend.vllm_url else None,
                   model_dir=cfg.checkpoint, run_dir=run_dir, seed=cfg.run.seed, temperature=1.0,
                   interval=1, startup_timeout=cfg.rollout.backend.vllm_startup_timeout,
                   request_timeout=cfg.rollout.backend.vllm_request_timeout)


class VllmBackend:
    def __init__(self, settings: VllmSettings, rank: int, device, client: VllmClient | None,
                 *, python: str | None = None, ctx=None):
        self.settings, self.rank, self.device = settings, rank, device
        self.client, self.server = client, None
        self.python = python  # the vLLM environment an owned server starts from
        self.sync = self._disk_sync(ctx)
        self.samplers: list[VllmSampler] = []
        self.version = 0  # the trainer steps behind the server's weights
        self.vocab_size: int | None = None  # the policy's token ids: [0, vocab_size)

    def _disk_sync(self, ctx) -> DiskSync:
        """Rank r's own folder, or under FSDP2 one folder that rank 0 writes for all (with
        ``--vllm-url``, ranks below the URLs' number reload: one per distinct server)."""
        conf = self.settings
        if not conf.fsdp:
            return DiskSync(self.client, os.path.join(conf.run_dir,
                                                      f"vllm-weights-rank{self.rank}"))
        reloads = conf.urls is None or self.rank < len(conf.urls)
        return DiskSync(self.client, os.path.join(conf.run_dir, "vllm-weights"),
                        Shards(ctx, conf.bucket_bytes, reloads))

    @classmethod
    def open(cls, settings: VllmSettings, rank: int, device, ctx=None, *,
             slot: int | None = None) -> VllmBackend:
        """Before any model loads: a ``--vllm-url`` server must answer (else exit 2); for an
        owned server the vLLM environment must exist at a supported version. ``ctx``
        (``group``, ``device``, ``is_main``): the ranks an FSDP2 model is sharded over;
        ``slot``: which ``--vllm-url`` entry (mod their number) when not ``rank``'s."""
        if settings.urls:
            url = settings.urls[(rank if slot is None else slot) % len(settings.urls)]
            client = connect(url, "--vllm-url", timeout=settings.request_timeout)
            return cls(settings, rank, device, client, ctx=ctx)
        python = vllm_python()
        installed_version(python)
        return cls(settings, rank, device, None, python=python, ctx=ctx)

    def start(self, module, *, bf16: bool, lora=None) -> None:
        """Owned: write ``module``'s weights (version 0) and serve them; either way the
        server must answer, serve this model and sample a token (else exit 2). ``lora``:
        peft's tuner of a ``--lora-rank`` policy, whose adapter is then loaded by name."""
        self.vocab_size = getattr(getattr(module, "config", None), "vocab_size", None)
        if lora is not None:
            self.sync = LoraSync(self.client, self.sync.folder, lora)
        if self.client is None:
            self._start_owned(module, bf16=bf16, lora=lora)
        else:
            self._check_served(module, lora=lora)
        if lora is not None:
            self._load_first_adapter(module, lora)
        try:
            self.client.complete([0], max_tokens=1, temperature=1.0, top_p=1.0, top_k=-1,
                                 seed=0, stop_token_ids=[])
        except ServerError as e:
            raise InputError(f"the model {self.settings.model_dir} does not run on vLLM: "
                             f"{e}") from e

    def _start_owned(self, module, *, bf16: bool, lora) -> None:
        """A server of this rank's own on version 0: the trainer's weights written untied
        (vllm_weights.py; under FSDP2 gathered and written once, by rank 0), or with LoRA
        the --hf-checkpoint itself (its weights never change, only the adapter does)."""
        conf = self.settings
        if lora is None:
            self.sync.current = path = os.path.join(self.sync.folder, "v0")
            self.sync.write(module, path)
        else:
            path = os.path.abspath(conf.model_dir)
        self.server = VllmServer.start(
            path, tokenizer=os.path.abspath(conf.model_dir),
            log_path=os.path.join(conf.run_dir, f"vllm-rank{self.rank}.log"),
            dtype="bfloat16" if bf16 else "float32", seed=conf.seed,
            logprobs_mode=log_probs_mode(conf.temperature), python=self.python,
            max_lora_rank=lora and lora_rank_slot(lora.peft_config["default"].r))
        self.client = self.sync.client = self.server.client(conf.request_timeout)
        self.server.wait_ready(conf.startup_timeout)
        self.client.served_model()

    def _load_first_adapter(self, module, lora) -> None:
        """Version 0's adapter (or a resumed one's, later) loaded by name: a server that
        cannot load adapters stops the run here, in one line, before any step."""
        rank = lora.peft_config["default"].r
        try:
            self.sync.push(module, self.version)
        except ServerError as e:
            how = ("" if self.server else f"; start it with --enable-lora --max-lora-rank "
                   f"{lora_rank_slot(rank)} and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
            raise InputError(f"--lora-rank {rank}: {self.client.describe()} cannot load the "
                             f"adapter ({e}){how}") from e

    def _check_served(self, module, *, lora) -> None:
        """A ``--vllm-url`` server serves the model, untied unless only an adapter is
        loaded (see vllm_weights.py)."""
        served = self.client.served_model()
        root = str(served.get("root") or served["id"])
        if os.path.realpath(root) != os.path.realpath(self.settings.model_dir):
            raise InputError(f"{self.client.describe()} serves {root!r}, not the model "
                             f"{self.settings.model_dir}; start it on that model or correct "
                             "the URL")
        if lora is None and getattr(module.config, "tie_word_embeddings", False):
            raise InputError(f"--vllm-url {self.client.url}: the model ties its word "
                             "embeddings, and vLLM 0.32's weight reload would leave the "
                             "server's output layer at the start-up weights; leave out "
                             "--vllm-url (Relax then starts a server on an untied copy)")

    def sampler(self, params: SamplingParams, *, eos_token_ids: list[int],
                pad_token_id: int) -> VllmSampler:
        s = VllmSampler(self.client, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                        params=params, device=self.device, version=self.version,
                        chunk=self.settings.partial_chunk, vocab_size=self.vocab_size)
        self.samplers.append(s)
        return s

    def due(self, version: int) -> bool:
        """Whether the weights after ``version`` steps go to the server (every
        ``--update-weights-interval`` steps)."""
        return version % self.settings.interval == 0

    def push(self, module, version: int, tracker=None) -> int:
        """The server samples with ``module``'s weights (``version``) from now on; returns
        the bytes written (also ``vllm/weight_sync_bytes`` in ``tracker``, if given)."""
        nbytes = self.sync.push(module, version)
        self.version = version
        for s in self.samplers:
            s.version = version
        if tracker is not None:
            tracker.add_max("vllm/weight_sync_bytes", nbytes)
        return nbytes

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
