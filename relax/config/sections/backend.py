"""The backend section (``cfg.rollout.backend``): Relax's own decode engine, or vLLM servers
(``--rollout-backend vllm``): the flags and their rules (docs/configuration.md, "Rollout backend").

With vLLM the trainer samples through OpenAI-compatible vLLM servers, token ids in and out,
and pushes its weights to them after every ``--update-weights-interval`` steps
(relax/rollout/backends/vllm/vllm_client.py, vllm_sampler.py, vllm_sync.py); under
``--fully-async`` the rollout ranks own the servers and push the weights they receive. A
combination the backend cannot serve is refused here with one line naming it, before any
process starts. Torch-free, like the rest of validation; whether a URL answers is checked
when the trainer starts (before any model loads).
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import check_url
from relax.config.section import Needs, Section, option, reject
from relax.errors import ConfigError

BACKENDS = ("relax", "vllm")
WEIGHT_SYNCS = ("collective", "disk")
MAKE_TARGET = "make vllm"
MAX_LORA_RANK = 512  # vLLM 0.32's largest --max-lora-rank
# ``relax eval``'s words for the flags it shares (relax/config/flags.py)
EVAL_HELP = {
    "rollout_backend": "Who samples the evaluation: relax (the built-in decode engine) or vllm "
                       "(a vLLM OpenAI server on the checkpoint's weights, started from the "
                       f"environment `{MAKE_TARGET}` builds unless --vllm-url names running ones).",
}
# flags of this section that ``relax eval`` refuses by name rather than as unknown ones
# (relax/config/flags.py): why each is relax train's alone
EVAL_REFUSED = {
    "vllm_weight_sync": "a relax train flag (how the trainer's weights reach the vLLM "
                        "servers after an update); relax eval pushes no weights",
    "rollout_bf16": "a relax train flag (the sampler's precision against the trainer's); "
                    "relax eval has one model and samples at --bf16 / --no-bf16",
}


# a vLLM flag given without --rollout-backend vllm is a mistake worth one line (in relax eval too)
NEEDS_VLLM = Needs(lambda cfg: cfg.rollout.backend.rollout_backend == "vllm",
                   "has no effect without --rollout-backend vllm; add it or remove this flag",
                   commands=("train", "eval"))
_SECONDS = (lambda v: 0 < v <= 86400, "must lie in (0, 86400] seconds")


@dataclass(frozen=True)
class BackendSection(Section):
    """Who samples: Relax's decode engine or vLLM servers fed the trainer's weights
    (docs/configuration.md, "Rollout backend")."""

    rollout_backend: str = option(
        'relax',
        'Who samples the rollouts: relax (the built-in decode engine, in the training process)'
        ' or vllm (vLLM OpenAI servers, one per rank (with --fully-async: per rollout rank) or '
        '--vllm-num-servers of them, started from the environment '
        f'`{MAKE_TARGET}` builds unless --vllm-url names running ones; the weights reach them after every '
        '--update-weights-interval steps).',
        choices=BACKENDS)
    vllm_url: tuple | None = option(
        None,
        'With --rollout-backend vllm: base URLs of vLLM servers already running (started with '
        "VLLM_SERVER_DEV_MODE=1, serving the model, sharing this machine's file system for the"
        ' weight sync), any number: each rank pools them all behind a router (least-loaded, an '
        "episode's turns on one server, a failed server taken out and its requests sent "
        'elsewhere; with --fully-async rollout rank i of R pools URLs i, i+R, ...). Must all '
        'answer when the command starts.',
        nargs='+',
        metavar='URL',
        default_text='Relax starts and owns the servers (--vllm-num-servers)',
        requires=NEEDS_VLLM)
    vllm_num_servers: int | None = option(
        None,
        'With --rollout-backend vllm: how many vLLM servers Relax starts and owns, apart from '
        'the rank count: server k is started by rank k mod R of the R sampling ranks (its log '
        'OUTPUT_DIR/vllm-server<k>.log), and every rank pools all of them behind the router '
        'of --vllm-url (with --fully-async rollout rank i pools only the servers i, i+R, ... '
        'it started, so at least one per rollout rank). Refused with --vllm-url.',
        metavar='N',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 servers, e.g. 2"),
        default_text='one server per rank (with --fully-async: per rollout rank)',
        requires=NEEDS_VLLM)
    vllm_weight_sync: str | None = option(
        None,
        'How the weights reach the vLLM servers after an update: collective (streamed from '
        "the trainer's memory over a Gloo group per server, by vLLM's weight transfer routes "
        "and Relax's engine relax_gloo: a --vllm-url server needs Relax's vLLM plugin and "
        """--weight-transfer-config '{"backend": "relax_gloo"}') or disk (a safetensors """
        'directory each server reloads; a --vllm-url server must share this file system). '
        'With --lora-rank the adapter always goes by disk.',
        choices=WEIGHT_SYNCS,
        default_text='collective for the servers Relax starts, disk for --vllm-url servers '
                     'and with --lora-rank',
        requires=NEEDS_VLLM)
    vllm_startup_timeout: float = option(
        600.0,
        'Seconds a server Relax starts may take to answer (its model loaded); then the run '
        "stops with the server's log named.",
        metavar='SECONDS',
        bound=_SECONDS,
        requires=NEEDS_VLLM)
    vllm_request_timeout: float = option(
        600.0,
        'Seconds one generation or weight-sync request to a vLLM server may take; then the run'
        ' stops naming the server and its log.',
        metavar='SECONDS',
        bound=_SECONDS,
        requires=NEEDS_VLLM)
    vllm_partial_chunk_tokens: int = option(
        32,
        'With --partial-rollout: the unfinished responses are decoded in rounds of at most '
        'this many tokens, and the step stops after the first round at which it holds enough '
        'complete groups (a rule on token counts, so a seeded run repeats; 1 stops where '
        "Relax's engine would, at one request per token).",
        metavar='TOKENS',
        bound=(lambda v: v >= 1, "must be >= 1 tokens per round, e.g. 32"),
        requires=(NEEDS_VLLM, Needs(lambda cfg: cfg.rollout.partial.partial_rollout,
                                    "has no effect without --partial-rollout; add it or remove "
                                    "this flag")))

    rollout_bf16: bool | None = option(
        None,
        "The sampler's precision apart from the trainer's (--bf16): Relax's engine decodes "
        "under bf16 autocast (--no-rollout-bf16: in fp32), and the vLLM servers Relax starts "
        "get vLLM's --dtype bfloat16 (or float32); the sampler's log-probs are then a bf16 "
        "model's against an fp32 trainer (relax/precision.py). Refused with "
        "--vllm-url (those servers run at the dtype their user gave them).",
        default_text="the sampler follows --bf16")

    def check(self) -> None:
        if self.rollout_bf16 is not None and self.vllm_url:
            # the dtype is a server's start-up argument: Relax sets it only on servers it starts
            raise ConfigError("--rollout-bf16" if self.rollout_bf16 else "--no-rollout-bf16",
                              "sets the dtype of the vLLM servers Relax starts, and the "
                              "--vllm-url servers are not Relax's (their dtype is the one "
                              "their user started them with); remove this flag or --vllm-url")
        if self.vllm_num_servers is not None and self.vllm_url:
            # the servers are either Relax's (started here) or the user's (named): not both
            raise ConfigError(f"--vllm-num-servers {self.vllm_num_servers} --vllm-url "
                              f"{' '.join(self.vllm_url)}", "--vllm-num-servers counts the "
                              "servers Relax starts, and with --vllm-url it starts none; "
                              "remove one of them")
        if self.rollout_backend == "vllm":
            for url in self.vllm_url or ():
                check_url(self, "vllm_url", url)


# ------------------------------------------------------------------ rules across sections

def check_vllm_backend(cfg, explicit: set[str]) -> None:
    """Sections rollout.backend, model, rollout.sampling, placement, lora, rollout.off_policy:
    what the vLLM backend cannot serve, one line for the first."""
    if cfg.rollout.backend.rollout_backend != "vllm":
        return
    if cfg.model.hf_checkpoint is None:
        reject(cfg, "rollout_backend", "vLLM serves a model directory: pass --hf-checkpoint "
               "(the built-in tiny model's 16-wide attention heads are too narrow for vLLM's "
               "CPU kernels)")
    _check_log_prob_mode(cfg)
    urls = cfg.rollout.backend.vllm_url
    if cfg.placement.fully_async and urls and len(urls) < cfg.placement.rollout_num_gpus:
        # each rollout rank pushes its weights to its servers when its schedule says; two
        # sharing one would reload it under each other's requests
        reject(cfg, ("vllm_url", "rollout_num_gpus"), f"{len(urls)} server(s) for "
               f"{cfg.placement.rollout_num_gpus} rollout ranks: with --fully-async each "
               "rollout rank needs servers of its own (rollout rank i of R pools URLs i, i+R, "
               "...); pass at least one URL per rollout rank, or leave out --vllm-url")
    if cfg.rollout.backend.vllm_weight_sync == "collective" and cfg.lora.lora_rank > 0:
        reject(cfg, ("vllm_weight_sync", "lora_rank"), "a LoRA run sends only its adapter (a "
               "few MiB), which vLLM loads by name from disk: leave out --vllm-weight-sync "
               "collective or --lora-rank")
    owned = cfg.rollout.backend.vllm_num_servers
    if cfg.placement.fully_async and owned is not None and owned < cfg.placement.rollout_num_gpus:
        # as with --vllm-url: rollout rank i owns servers i, i+R, ... and reloads them alone
        reject(cfg, ("vllm_num_servers", "rollout_num_gpus"), f"{owned} server(s) for "
               f"{cfg.placement.rollout_num_gpus} rollout ranks: with --fully-async each "
               "rollout rank needs servers of its own (rollout rank i of R starts and pools "
               "servers i, i+R, ...); pass at least one server per rollout rank, or leave out "
               "--vllm-num-servers")
    if cfg.lora.lora_rank > MAX_LORA_RANK:
        reject(cfg, ("rollout_backend", "lora_rank"), f"vLLM 0.32 loads adapters up to rank "
               f"{MAX_LORA_RANK}; use a smaller --lora-rank")
    if cfg.placement.update_weights_interval > 1 and not cfg.rollout.off_policy.corrects_sampler:
        reject(cfg, "update_weights_interval", "vLLM then samples with weights up to I - 1 "
               "steps old, which needs an importance correction: add --use-tis (or "
               "--use-rollout-logprobs), or set --update-weights-interval 1")


def _check_log_prob_mode(cfg) -> None:
    """The sampler's log-prob must be softmax(z / T) before top-p / top-k truncation
    (relax/rollout/generation/generate.py ``sampled_log_probs``). vLLM returns either the raw model's
    (right when T == 1, truncation or not) or the processed distribution after temperature
    *and* truncation (right without truncation): with both T != 1 and truncation neither is."""
    truncated = cfg.rollout.sampling.rollout_top_p < 1.0 or cfg.rollout.sampling.rollout_top_k > 0
    if cfg.rollout.sampling.rollout_temperature != 1.0 and truncated:
        reject(cfg, ("rollout_backend", "rollout_temperature", "rollout_top_p",
                     "rollout_top_k"),
               "vLLM cannot return softmax(z / T) before top-p/top-k truncation (the "
               "distribution the trainer's log-probs describe) when both are set: use "
               "--rollout-temperature 1 or switch the truncation off")


def weight_sync(backend) -> str:
    """``--vllm-weight-sync`` as resolved: the flag, else disk for ``--vllm-url`` servers
    (their start-up flags are their user's), collective for the servers Relax starts. A
    LoRA run sends its adapter by disk whatever this says (vllm_backend.py ``start``; the
    flag itself is refused with --lora-rank above)."""
    if backend.vllm_weight_sync is not None:
        return backend.vllm_weight_sync
    return "disk" if backend.vllm_url else "collective"


def log_probs_mode(temperature: float) -> str:
    """vLLM's ``--logprobs-mode`` that gives softmax(z / T) before truncation under the
    rules above: the raw logits' at T == 1, the processed (temperature-scaled) otherwise."""
    return "raw_logprobs" if temperature == 1.0 else "processed_logprobs"
