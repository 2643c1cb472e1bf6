"""relax/host_memory.py: with the memory-map threshold fixed, freed tensors leave the process.

Each case runs in a fresh interpreter: the threshold is process state, and the control (glibc's
dynamic threshold) needs a process that never fixed it. The scenario is a training step's in
small: a large block freed (glibc then raises its threshold), then 4 MiB tensors each followed
by a small block that stays alive, then the 4 MiB tensors freed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from relax.config import ConfigError, parse_eval_config, parse_train_config
from relax.host_memory import set_mmap_threshold

pytestmark = pytest.mark.subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = r"""
import sys
import torch
from relax.host_memory import set_mmap_threshold

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) // 1024

print(set_mmap_threshold(int(sys.argv[1])))
torch.set_num_threads(1)
x = torch.ones(20 << 18)  # 20 MiB, mapped, then freed
del x
base = rss_mib()
big, small = [], []
for _ in range(40):
    big.append(torch.ones(4 << 18))  # 4 MiB
    small.append(torch.ones(64))     # stays alive, above it in the heap
del big
print(rss_mib() - base)
"""


def retained_mib(kib: int) -> tuple[bool, int]:
    """(whether the threshold was set, MiB of the freed tensors still resident)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    env["PYTHONPATH"] = REPO
    out = subprocess.run([sys.executable, "-c", SCENARIO, str(kib)], capture_output=True,
                         text=True, env=env, timeout=120, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc: Linux")
def test_freed_tensors_go_back_to_the_os_with_the_threshold_fixed():
    was_set, kept = retained_mib(128)
    assert was_set
    assert kept < 20, f"{kept} MiB of 160 MiB of freed tensors stayed in the process"
    # the control: glibc's dynamic threshold (the default, 0) keeps them
    was_set, kept = retained_mib(0)
    assert not was_set
    assert kept > 120, f"only {kept} MiB stayed with glibc's dynamic threshold"


def test_an_explicit_glibc_setting_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert set_mmap_threshold(128) is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert set_mmap_threshold(0) is False


def test_the_flag_default_and_its_bounds():
    assert parse_train_config([]).system.host_mmap_threshold_kb == 0  # glibc's own behaviour
    assert parse_train_config(["--host-mmap-threshold-kb", "128"]).system.host_mmap_threshold_kb == 128
    for bad in ("-1", "40000"):
        with pytest.raises(ConfigError, match="--host-mmap-threshold-kb.*between 0"):
            parse_train_config(["--host-mmap-threshold-kb", bad])


def test_relax_eval_takes_the_flag_with_the_same_bounds(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory, as eval checks
    assert parse_eval_config([str(tmp_path), "--host-mmap-threshold-kb", "128"]
                             ).system.host_mmap_threshold_kb == 128
    with pytest.raises(ConfigError, match="--host-mmap-threshold-kb.*between 0"):
        parse_eval_config([str(tmp_path), "--host-mmap-threshold-kb", "40000"])
