"""The one place that turns ``--rollout-backend`` into a :class:`RolloutBackend`
(protocol.py): for a training rank or a rollout rank of ``relax train``
(:func:`open_backend`), and for ``relax eval`` (:func:`open_eval_backend`). Everything else
holds the backend it is given and calls the protocol.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable

import torch

from relax.rollout.backends.local import LocalBackend
from relax.rollout.backends.protocol import RolloutBackend
from relax.rollout.backends.vllm.vllm_backend import VllmBackend, VllmSettings


def open_backend(rollout, rank: int, device: torch.device, *, placement, model, run,
                 shards=None, slot: tuple[int, int] | None = None, ranks=None,
                 release: Callable[[torch.nn.Module], None] | None = None) -> RolloutBackend:
    """``relax train``'s backend on rank ``rank`` (a training rank's, or under --fully-async a
    rollout rank's world rank), checked before any model loads: an unreachable --vllm-url or
    a missing vLLM install exits 2 here. ``shards`` (``group``, ``device``, ``is_main``): the
    ranks an FSDP2 module is sharded over, None for a whole module; ``slot`` (i, R): pool
    only --vllm-url entries (or owned servers) i, i+R, ... (rollout rank i of R), None: every
    one; ``ranks``: the training ranks of a colocated run, which start the owned servers
    between them and pool the same servers (each reloads its share of them, vllm_sync.py
    ``Split``); ``release``: frees what a
    sharded module's no-grad pass gathered (local.py). ``rollout``, ``placement``, ``model``,
    ``run``: the configuration's sections (the backend, its sampling temperature, the
    --hf-checkpoint it serves, the run's directory and seed)."""
    backend = rollout.backend
    if backend.rollout_backend == "relax":
        if shards is None:
            return LocalBackend(device)
        return LocalBackend(device, sync_group=shards.group, release=release)
    settings = VllmSettings.of_train(
        backend, placement, model_dir=model.hf_checkpoint, run_dir=run.output_dir,
        seed=run.seed, temperature=rollout.sampling.rollout_temperature,
        fsdp=shards is not None)
    return VllmBackend.open(settings, rank, device, shards, slot=slot, ranks=ranks)


def open_eval_backend(rollout, device: torch.device, *, checkpoint: str, run) -> RolloutBackend:
    """``relax eval``'s backend (``rollout``'s), before the ``checkpoint`` loads. vLLM serves
    the checkpoint's weights, written to ``--output-dir`` (``run``: the run section, its
    directory and seed) or a scratch folder (both removed at close)."""
    backend = rollout.backend
    if backend.rollout_backend == "relax":
        return LocalBackend(device)
    scratch = None if run.output_dir else tempfile.mkdtemp(prefix="relax-eval-vllm-")
    settings = VllmSettings.of_eval(backend, model_dir=checkpoint,
                                    run_dir=run.output_dir or scratch, seed=run.seed,
                                    scratch=scratch is not None)
    try:
        return VllmBackend.open(settings, 0, device)
    except BaseException:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
