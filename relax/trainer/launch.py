"""Launching ``relax train``: the signal handlers, the process group, the trainer, and how
each way a run ends becomes an exit status.

Exit status of :func:`train`: 0 (finished, or stopped by ``--exit-duration-in-mins``), 2 for
bad input, 1 for a failure during training (a collective that failed because a peer died is
named as such), 128 + the signal number when SIGTERM/SIGINT stopped the run (after a
checkpoint with ``--save``). Guarantees and the tests behind them: docs/reliability.md.
"""

from __future__ import annotations

import os
import sys
import time

from relax.errors import Interrupted, PeerFailure, RelaxError
from relax.host_memory import set_mmap_threshold
from relax.trainer.distributed import (
    exit_rank,
    finish_together,
    init_distributed,
    is_peer_failure,
    leave_rank,
    shutdown_distributed,
)
from relax.trainer.fully_async.async_layout import check_same_settings, split_roles
from relax.trainer.fully_async.rollout_worker import serve_rollouts
from relax.trainer.loop import Trainer
from relax.trainer.signals import StopRequest


def run(cfg, *, console: bool = True) -> list[dict[str, float]]:
    """Train as configured; return the metrics of each rollout step (raises RelaxError)."""
    start = time.perf_counter()
    set_mmap_threshold(cfg.system.host_mmap_threshold_kb)  # 0: glibc's own behaviour
    stop = StopRequest()
    stop.install()
    try:
        ctx = init_distributed(cfg.system.device, cfg.run.distributed_timeout_minutes)
        layout = None
        if ctx.world_size > 1:  # nodes launched with other flags would wait on each other
            check_same_settings(cfg)
        if cfg.placement.fully_async:  # rollout ranks serve batches; the others train on them
            layout, ctx = split_roles(ctx, cfg.world_size,
                                      async_save=cfg.checkpoint.async_save)
            if layout.is_rollout:
                serve_rollouts(cfg, ctx, layout, stop)
                return []
        trainer = Trainer(cfg, ctx, console=console, stop=stop, layout=layout)
        together = False  # every rank of the job reaches the end (also after a signal stop)
        try:
            history = trainer.fit()
            ended_early = trainer.control.ended_early
            finish_together(ctx)
            together = True
        except Interrupted:
            together = True
            raise
        finally:
            trainer.close()  # --fully-async: the rollout ranks stop here
            if layout is not None and together:
                layout.finish_together()
    except RelaxError:
        raise
    except Exception as e:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and is_peer_failure(e):
            raise PeerFailure(
                "a collective failed: another data-parallel rank died or did not answer "
                f"within --distributed-timeout-minutes {cfg.run.distributed_timeout_minutes:g} "
                "(see its own message): "
                f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e
        raise
    finally:
        stop.restore()
    if ctx.is_main and console:
        _report_end(cfg.run.output_dir, cfg.checkpoint.save, len(history),
                    time.perf_counter() - start, ended_early)
    return history


def _report_end(output_dir: str, save: str | None, steps: int, seconds: float,
                ended_early: str | None) -> None:
    """The run's last line: steps, time, where the metrics (``--output-dir``) and the model
    (``--save``) are."""
    where = f"; model saved to {save}" if save else ""
    if ended_early:
        where += f" ({ended_early}; continue with --load {save})" if save else f" ({ended_early})"
    print(f"relax train: {steps} rollout steps in {seconds:.1f} s; "
          f"metrics in {os.path.join(output_dir, 'metrics.jsonl')}{where}", file=sys.stderr)


def role_of(placement, rank: str, world: int) -> str:
    """``--fully-async`` (the placement section): which side a rank is on, for its error
    line."""
    if not placement.fully_async or not rank.isdigit():
        return ""
    return " rollout" if int(rank) >= world - placement.rollout_num_gpus else " training"


def train(cfg) -> int:
    """``relax train``: exit status 0, or print one ``relax train: error:`` line and return
    the error's status (2 bad input, 1 failure during training).

    A rank of a multi-process run does not return: it ends its process with that status
    through :func:`exit_rank` once the group is left, so the interpreter's finalization never
    meets Gloo's worker threads (see there), unless multiprocessing started it
    (:func:`leave_rank`). Neither does a run stopped at once (a second
    signal, or one during start-up, :class:`relax.errors.Interrupted` ``at_once``): it ends
    without exit handlers, within the signal's bound whatever threads still run."""
    peer_failed = at_once = False
    try:
        run(cfg)
        status = 0
    except RelaxError as e:
        peer_failed = isinstance(e, PeerFailure)
        at_once = isinstance(e, Interrupted) and e.at_once
        rank = os.environ.get("RANK")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        prefix = f"[rank {rank}{role_of(cfg.placement, rank, world)}] " if rank is not None and world != 1 \
            else ""
        print(f"relax train: error: {prefix}{e}", file=sys.stderr, flush=True)
        status = e.exit_code
    finally:
        shutdown_distributed(peer_failed=peer_failed)
    if at_once:
        # a stop at once does not wait for what still runs: the interpreter's exit would join
        # the reward client's worker threads, and a request in flight can take its deadline
        exit_rank(status, run_exit_handlers=False)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # after a peer failure the broken group is left as it is; metrics and checkpoints are
        # already on disk
        return leave_rank(status, run_exit_handlers=not peer_failed)
    return status
