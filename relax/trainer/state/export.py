"""``relax export``: the model of a Relax checkpoint as a Hugging Face directory.

A full fine-tuning checkpoint's shards are loaded into the model its ``config.json`` describes
(relax/trainer/state/sharded_state.py); a LoRA checkpoint's shards hold the adapter only, so its
PEFT copy (``adapter/``) is merged into the base model instead.
"""

from __future__ import annotations

import os
import shutil

from relax.errors import InputError
from relax.models import load_adapter_model
from relax.trainer.policy.lora import ADAPTER_DIR
from relax.trainer.state import sharded_state
from relax.trainer.state.checkpoint import _PICKLE_SUFFIXES, MARKER, _fsync, latest_checkpoint
from relax.trainer.state.sharded_state import METADATA


def export_checkpoint(source: str, out: str) -> tuple[str, int]:
    """``relax export``: write the model of a checkpoint as a Hugging Face directory.

    ``source`` is a checkpoint directory or a ``--save`` directory (its newest complete
    checkpoint). ``out`` must be new or empty; it appears in one rename when complete.
    Returns the checkpoint used and its step.
    """
    found = latest_checkpoint(source, checksums=True, prog="relax export", where="CHECKPOINT")
    if found is None:
        raise InputError(f"CHECKPOINT {source}: no complete Relax checkpoint in it")
    ckpt, step = found
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise InputError(f"OUTPUT_DIR {out}: exists and is not an empty directory; choose a "
                         "new one")
    adapter = os.path.join(ckpt, ADAPTER_DIR)
    # a LoRA checkpoint's shards hold the adapter only: its PEFT copy merged into the base
    model = (load_adapter_model(adapter) if os.path.isdir(adapter)
             else sharded_state.load_hf_model(ckpt))
    tmp = f"{out.rstrip(os.sep)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        skip = {MARKER, METADATA}
        for name in os.listdir(ckpt):  # config, generation config, tokenizer files
            if name in skip or name.endswith((".distcp", *_PICKLE_SUFFIXES)):
                continue
            if os.path.isfile(os.path.join(ckpt, name)):
                shutil.copy2(os.path.join(ckpt, name), os.path.join(tmp, name))
        model.save_pretrained(tmp, safe_serialization=True)
        for name in os.listdir(tmp):
            _fsync(os.path.join(tmp, name))
        if os.path.isdir(out):
            os.rmdir(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ckpt, step

