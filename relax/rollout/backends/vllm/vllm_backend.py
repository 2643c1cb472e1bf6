"""``--rollout-backend vllm`` assembled for one rank: its server (started and owned, or named
by ``--vllm-url``), the sampler the collectors call and the weight sync after updates; also
``relax eval --rollout-backend vllm``'s server.

    backend = open_backend(cfg.rollout, rank, device, placement=..., model=..., run=...,
                           shards=ctx)  # relax/rollout/backends/open.py
    backend.start(module, bf16=False, lora=None)       # serving, answering, sampling
    sampler = backend.sampler(params, eos_token_ids=eos, pad_token_id=pad)
    if backend.due(version):                           # every --update-weights-interval steps
        backend.push(module, version, tracker)
    backend.close()                                    # the servers it started are gone

The ranks pool their servers behind a router (router.py: least-loaded, episodes kept on
one server, a failed server taken out and its requests sent again elsewhere): every
``--vllm-url`` server, or the N servers Relax starts and owns (``--vllm-num-servers``,
default one per sampling rank; :class:`Owned`: server k is started by sampling rank k mod R,
its log ``RUN_DIR/vllm-server<k>.log``, and the ranks learn each other's URLs with one
``all_gather_object``). Each server is reloaded by one rank (server j by rank j mod R,
vllm_sync.py ``Split``), from that rank's weights ``RUN_DIR/vllm-weights-rank<r>/``. Under
``--fully-async`` rollout rank i of R pools only entries (or owned servers) i, i+R, ...
(``slot``), so two rollout ranks, which reload on schedules of their own, never share one.
An owned server starts once the model is loaded, from that model's weights written as ``v0``
(untied: relax/rollout/backends/vllm/vllm_weights.py), so it samples exactly the trainer's weights.
The updates are streamed from memory (``--vllm-weight-sync collective``, the default for owned
servers, which then start with Relax's transfer engine: vllm_collective.py; each rank streams
to the servers it reloads) or written like ``v0`` and reloaded (``disk``, the default for
``--vllm-url`` servers); under FSDP2 rank 0 writes every version into
``RUN_DIR/vllm-weights/`` for all ranks' servers, or every rank gathers each bucket and
streams it to its own. A
LoRA run (``lora``: peft's tuner) serves --hf-checkpoint itself with ``--enable-lora`` and
loads the adapter by name after each update (vllm_sync.py ``LoraSync``).
:meth:`VllmBackend.start` waits for it (at most ``--vllm-startup-timeout``) and
samples one token, so a model the server cannot run stops the run with one line before
training instead of at the first rollout.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import torch.distributed as dist

from relax.agreement import GroupAgreement
from relax.config.section import default_of
from relax.config.sections.backend import BackendSection, log_probs_mode, weight_sync
from relax.config.sections.placement import PlacementSection
from relax.config.sections.system import SystemSection
from relax.errors import InputError
from relax.rollout.backends.vllm.router import ServerPool
from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient, connect
from relax.rollout.backends.vllm.vllm_collective import ENGINE, CollectiveSync
from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
from relax.rollout.backends.vllm.vllm_server import VllmServer, installed_version, vllm_python
from relax.rollout.backends.vllm.vllm_sync import DiskSync, LoraSync, Shards, Split
from relax.rollout.backends.vllm.vllm_weights import lora_rank_slot
from relax.rollout.generation.sampler import SamplingParams


@dataclass(frozen=True)
class VllmSettings:
    """What the backend reads of a command's configuration (relax/rollout/backends/open.py
    fills it): ``urls`` (``--vllm-url``, None: owned servers), ``model_dir`` (the model and
    its tokenizer), ``run_dir`` (logs and weight directories), the sampling ``temperature``
    (picks the log-prob mode), the sync ``interval`` and ``num_servers`` (the owned servers,
    ``--vllm-num-servers``; None: one per sampling rank)."""

    urls: tuple[str, ...] | None
    model_dir: str
    run_dir: str
    seed: int
    temperature: float
    interval: int
    startup_timeout: float
    request_timeout: float
    fsdp: bool = default_of(SystemSection, "fsdp")  # --fsdp: the sync gathers the shards (vllm_sync.py ``Shards``)
    # --weight-sync-bucket-mb and --vllm-partial-chunk-tokens (vllm_sampler.py): the
    # sections' defaults, written once there
    bucket_bytes: int = int(default_of(PlacementSection, "weight_sync_bucket_mb") * 2**20)
    partial_chunk: int = default_of(BackendSection, "vllm_partial_chunk_tokens")
    sync: str = "disk"  # --vllm-weight-sync as resolved: "collective" or "disk"
    keep_weights: bool = True  # False (relax eval): the written weights go at close
    scratch: bool = False  # run_dir is the command's scratch folder, removed at close
    num_servers: int | None = None

    @classmethod
    def of_train(cls, backend, placement, *, model_dir: str, run_dir: str, seed: int,
                 temperature: float, fsdp: bool) -> VllmSettings:
        """``relax train``'s: ``backend`` is ``cfg.rollout.backend``, ``placement``
        ``cfg.placement`` (the sync interval and bucket size)."""
        return cls(urls=tuple(backend.vllm_url) if backend.vllm_url else None,
                   model_dir=model_dir, run_dir=run_dir, seed=seed, temperature=temperature,
                   interval=placement.update_weights_interval,
                   startup_timeout=backend.vllm_startup_timeout,
                   request_timeout=backend.vllm_request_timeout, fsdp=fsdp,
                   bucket_bytes=int(placement.weight_sync_bucket_mb * 2**20),
                   partial_chunk=backend.vllm_partial_chunk_tokens,
                   num_servers=backend.vllm_num_servers, sync=weight_sync(backend))

    @classmethod
    def of_eval(cls, backend, *, model_dir: str, run_dir: str, seed: int,
                scratch: bool) -> VllmSettings:
        """``relax eval``'s: the checkpoint's weights, no sync, the weights written removed
        at close (``scratch``: ``run_dir`` too); no log-prob is read, so the mode is the
        raw one."""
        return cls(urls=tuple(backend.vllm_url) if backend.vllm_url else None,
                   model_dir=model_dir, run_dir=run_dir, seed=seed, temperature=1.0,
                   interval=1, startup_timeout=backend.vllm_startup_timeout,
                   request_timeout=backend.vllm_request_timeout, keep_weights=False,
                   scratch=scratch)


@dataclass(frozen=True)
class Owned:
    """Where the ``servers`` owned servers run and who pools them, for sampling rank ``rank``
    of ``ranks``: server k (0 .. servers - 1) is started by rank k mod ``ranks``. A colocated
    rank pools all of them (a rank that starts none too), each reloaded by the rank that
    started it (vllm_sync.py ``Split``: server j by rank j mod R); ``own_only``
    (--fully-async's rollout ranks, which reload on independent schedules): only those it
    started, i, i + R, ..."""

    servers: int
    ranks: int = 1
    rank: int = 0
    own_only: bool = False

    @property
    def started(self) -> list[int]:
        """The servers this rank starts (and closes)."""
        return list(range(self.rank, self.servers, self.ranks))

    @property
    def pooled(self) -> list[int]:
        """The servers in this rank's pool."""
        return self.started if self.own_only else list(range(self.servers))

    @classmethod
    def of(cls, servers: int | None, *, slot: tuple[int, int] | None, ranks) -> Owned:
        """``servers``: --vllm-num-servers (None: one per sampling rank); ``slot`` (i, R):
        rollout rank i of R under --fully-async; ``ranks``: the colocated training ranks
        (``rank``, ``world_size``; None: this process alone, as ``relax eval``)."""
        if slot is not None:
            first, stride = slot
            return cls(servers or stride, stride, first, own_only=True)
        count, rank = (ranks.world_size, ranks.rank) if ranks is not None else (1, 0)
        return cls(servers or count, count, rank)


class VllmBackend:
    """One rank's vLLM servers as a rollout backend (relax/rollout/backends/protocol.py)."""

    remote = True  # the server generates; the weights reach it only by push

    def __init__(self, settings: VllmSettings, rank: int, device,
                 target: VllmClient | ServerPool | None, *, python: str | None = None,
                 ctx=None, ranks=None, owned: Owned | None = None):
        """``target``: the pool of ``--vllm-url`` servers (or one client of one), None for
        owned servers (started by :meth:`start` where ``owned`` says, default this rank's
        one); ``ctx``: the ranks an FSDP2 model is sharded over; ``ranks``: the ranks whose
        pools hold the same servers (a colocated run's training ranks; default ``ctx``),
        each server then loaded by one of them."""
        self.settings, self.rank, self.device = settings, rank, device
        self.pool = None if target is None else ServerPool.of(target)
        self.owned = owned or Owned(1)
        self.ranks = ranks or ctx
        self.servers: list[VllmServer] = []  # the servers this rank started
        self.python = python  # the vLLM environment an owned server starts from
        # the start-up weights (v0 of an owned server) always go by disk; the updates by
        # --vllm-weight-sync's choice
        self.disk = self._disk_sync(ctx, self.ranks)
        self.sync: DiskSync | CollectiveSync | LoraSync = self.disk
        if settings.sync == "collective":
            self.sync = CollectiveSync(self.pool, timeout=settings.request_timeout,
                                       bucket_bytes=settings.bucket_bytes,
                                       shards=self.disk.shards, split=self.disk.split)
        self.samplers: list[VllmSampler] = []
        self.version = 0  # the trainer steps behind the server's weights
        self.vocab_size: int | None = None  # the policy's token ids: [0, vocab_size)

    @property
    def client(self) -> VllmClient | None:
        """The first server's client (the only one of a pool of one)."""
        return None if self.pool is None else self.pool.clients[0]

    @property
    def server(self) -> VllmServer | None:
        """The first server this rank started."""
        return self.servers[0] if self.servers else None

    def _disk_sync(self, ctx, ranks) -> DiskSync:
        """Rank r's own folder, or under FSDP2 one folder that rank 0 writes for all; a
        server shared by ``ranks`` (a ``--vllm-url`` one, or an owned one pooled by all) is
        reloaded by one of them (entry j by rank j mod their number, vllm_sync.py ``Split``),
        which for an owned server is the rank that started it."""
        conf = self.settings
        shared = (ranks is not None and ranks.world_size > 1
                  and (conf.urls is not None or not self.owned.own_only))
        split = Split(ranks) if shared else None
        if not conf.fsdp:
            return DiskSync(self.pool, os.path.join(conf.run_dir,
                                                    f"vllm-weights-rank{self.rank}"),
                            split=split)
        return DiskSync(self.pool, os.path.join(conf.run_dir, "vllm-weights"),
                        Shards(ctx, conf.bucket_bytes), split=split)

    @classmethod
    def open(cls, settings: VllmSettings, rank: int, device, ctx=None, *,
             slot: tuple[int, int] | None = None, ranks=None) -> VllmBackend:
        """Before any model loads: every ``--vllm-url`` server of the pool must answer (else
        exit 2); for an owned server the vLLM environment must exist at a supported version.
        ``ctx`` (``group``, ``device``, ``is_main``): the ranks an FSDP2 model is sharded over;
        ``slot`` (i, R): pool only entries (or owned servers) i, i+R, ... (rollout rank i of R
        under --fully-async, so that the rollout ranks never share a server); None: all of
        them; ``ranks``: the ranks pooling the same servers (a colocated run's training
        ranks), which start the owned ones between them (:class:`Owned`)."""
        if settings.urls:
            first, stride = slot if slot is not None else (0, 1)
            indices = list(range(first, len(settings.urls), stride))
            clients = [connect(settings.urls[i], "--vllm-url", timeout=settings.request_timeout)
                       for i in indices]
            pool = ServerPool(clients, indices, total=len(settings.urls))
            return cls(settings, rank, device, pool, ctx=ctx, ranks=ranks)
        python = vllm_python()
        installed_version(python)
        owned = Owned.of(settings.num_servers, slot=slot, ranks=ranks)
        return cls(settings, rank, device, None, python=python, ctx=ctx, ranks=ranks,
                   owned=owned)

    def start(self, module, *, bf16: bool, lora=None) -> None:
        """Owned: write ``module``'s weights (version 0) and serve them; either way the
        server must answer, serve this model and sample a token (else exit 2). ``lora``:
        peft's tuner of a ``--lora-rank`` policy, whose adapter is then loaded by name."""
        self.vocab_size = getattr(getattr(module, "config", None), "vocab_size", None)
        if lora is not None:
            self.sync = LoraSync(self.pool, self.disk.folder, lora, split=self.disk.split)
        if self.pool is None:
            self._start_owned(module, bf16=bf16, lora=lora)
        else:
            for client in self.pool.clients:
                self._check_served(client, module, lora=lora)
        if lora is not None:
            self._load_first_adapter(module, lora)
        for client in self.pool.clients:
            try:
                client.complete([0], max_tokens=1, temperature=1.0, top_p=1.0, top_k=-1,
                                seed=0, stop_token_ids=[])
            except ServerError as e:
                raise InputError(f"the model {self.settings.model_dir} does not run on "
                                 f"vLLM: {e}") from e
        try:  # the servers report the version they serve from now on (router.py)
            self.pool.announce(self.version)
        except ServerError as e:
            raise InputError(f"{e}; Relax tells each server the weights version it serves "
                             "(VLLM_SERVER_DEV_MODE=1 routes)") from e

    def _start_owned(self, module, *, bf16: bool, lora) -> None:
        """This rank's share of the owned servers (:class:`Owned`) on version 0: the
        trainer's weights written untied (vllm_weights.py; under FSDP2 gathered and written
        once, by rank 0), or with LoRA the --hf-checkpoint itself (its weights never change,
        only the adapter does); then the pool of the servers this rank pools, every rank's
        started and answering first."""
        conf, owned = self.settings, self.owned
        if lora is None:
            self.disk.current = path = os.path.join(self.disk.folder, "v0")
            self.disk.write(module, path)
        else:
            path = os.path.abspath(conf.model_dir)
        error = None
        try:  # all started before any is waited for: they load their models side by side
            for k in owned.started:
                self.servers.append(VllmServer.start(
                    path, tokenizer=os.path.abspath(conf.model_dir),
                    log_path=os.path.join(conf.run_dir, f"vllm-server{k}.log"),
                    dtype="bfloat16" if bf16 else "float32", seed=conf.seed,
                    logprobs_mode=log_probs_mode(conf.temperature), python=self.python,
                    max_lora_rank=lora and lora_rank_slot(lora.peft_config["default"].r),
                    weight_transfer=ENGINE if isinstance(self.sync, CollectiveSync) else None))
            for server in self.servers:
                server.wait_ready(conf.startup_timeout)
        except Exception as e:  # the other ranks must not wait for URLs that never come
            error = e
        clients = self._pooled_clients(error)
        self.pool = self.disk.pool = self.sync.pool = ServerPool(
            clients, owned.pooled, total=owned.servers)
        for client in clients:
            client.served_model()

    def _pooled_clients(self, error: Exception | None) -> list[VllmClient]:
        """The clients of the servers this rank pools (``owned.pooled``), once every rank
        pooling them has started its own (``error``: this rank's failure to, raised on
        every rank): the URLs of the others' from one ``all_gather_object``."""
        timeout = self.settings.request_timeout
        shared = self.disk.split is not None
        if shared:
            GroupAgreement(self.ranks.group, self.ranks.device).raise_together(error)
        elif error is not None:
            raise error
        mine = {k: s.client(timeout)
                for k, s in zip(self.owned.started, self.servers, strict=True)}
        urls = {k: c.url for k, c in mine.items()}
        if shared:
            gathered: list = [None] * self.ranks.world_size
            dist.all_gather_object(gathered, urls, group=self.ranks.group)
            urls = {k: url for part in gathered for k, url in part.items()}
        return [mine[k] if k in mine else VllmClient(urls[k], timeout=timeout)
                for k in self.owned.pooled]

    def _load_first_adapter(self, module, lora) -> None:
        """Version 0's adapter (or a resumed one's, later) loaded by name: a server that
        cannot load adapters stops the run here, in one line, before any step."""
        rank = lora.peft_config["default"].r
        try:
            self.sync.push(module, self.version)
        except ServerError as e:
            how = ("" if self.settings.urls is None else f"; start it with --enable-lora "
                   f"--max-lora-rank {lora_rank_slot(rank)} and "
                   "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
            raise InputError(f"--lora-rank {rank}: {self.pool.describe()} cannot load the "
                             f"adapter ({e}){how}") from e

    def _check_served(self, client, module, *, lora) -> None:
        """A ``--vllm-url`` server serves the model, untied unless only an adapter is
        loaded (see vllm_weights.py)."""
        served = client.served_model()
        root = str(served.get("root") or served["id"])
        if os.path.realpath(root) != os.path.realpath(self.settings.model_dir):
            raise InputError(f"{client.describe()} serves {root!r}, not the model "
                             f"{self.settings.model_dir}; start it on that model or correct "
                             "the URL")
        if lora is None and getattr(module.config, "tie_word_embeddings", False):
            raise InputError(f"--vllm-url {client.url}: the model ties its word "
                             "embeddings, and vLLM 0.32's weight reload would leave the "
                             "server's output layer at the start-up weights; leave out "
                             "--vllm-url (Relax then starts a server on an untied copy)")

    def sampler(self, params: SamplingParams, *, eos_token_ids: list[int],
                pad_token_id: int) -> VllmSampler:
        s = VllmSampler(self.pool, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                        params=params, device=self.device, version=self.version,
                        chunk=self.settings.partial_chunk, vocab_size=self.vocab_size)
        self.samplers.append(s)
        return s

    def due(self, version: int) -> bool:
        """Whether the weights after ``version`` steps go to the server (every
        ``--update-weights-interval`` steps)."""
        return version % self.settings.interval == 0

    def behind(self, version: int) -> bool:
        """Whether the server samples older weights than ``version`` (a rollout rank pushes
        every version it receives: only those a batch needs arrive)."""
        return self.version != version

    def push(self, module, version: int, tracker=None) -> int:
        """The server samples with ``module``'s weights (``version``) from now on; returns
        the bytes written or streamed (also ``vllm/weight_sync_bytes`` in ``tracker``, if
        given)."""
        nbytes = self.sync.push(module, version)
        self.version = version
        for s in self.samplers:
            s.version = version
        if tracker is not None:
            tracker.add_max("vllm/weight_sync_bytes", nbytes)
        return nbytes

    def served(self) -> tuple[int, str] | None:
        """The oldest weights version the servers reported for the answers since the last
        call, and a URL that served it (router.py ``served``)."""
        return None if self.pool is None else self.pool.served()

    def record(self, tracker) -> None:
        """This step's per-server metrics (router.py ``record``): ``rollout/server<i>/...``,
        ``i`` the ``--vllm-url`` entry or the owned server's number, the same on every rank."""
        if self.pool is not None:
            self.pool.record(tracker)

    def close(self) -> None:
        """The servers this rank started stop; ``relax eval``'s weight copy and scratch
        folder go."""
        try:
            if self.pool is not None:
                self.pool.close()
            for server in self.servers:
                server.close()
        finally:
            if not self.settings.keep_weights:
                shutil.rmtree(self.disk.folder, ignore_errors=True)  # a copy of the checkpoint
            if self.settings.scratch:
                shutil.rmtree(self.settings.run_dir, ignore_errors=True)
