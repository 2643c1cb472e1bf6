"""--rollout-backend's rules (relax/config/sections/backend.py): what the vLLM backend cannot
serve is refused with one line naming the flags, --fully-async gives each rollout rank a
server, the log-prob mode exists for the sampling settings, and its flags need the
backend."""

from __future__ import annotations

import pytest

from relax.config.sections.backend import BackendSection, log_probs_mode, weight_sync
from relax.precision import use_rollout_bf16

BASE = ["train", "--dry-run", "--num-rollout", "2"]


@pytest.fixture
def vllm(tiny_model_dir):
    return [*BASE, "--rollout-backend", "vllm", "--hf-checkpoint", str(tiny_model_dir)]


def test_defaults_and_accepted_settings(cli, vllm):
    assert cli(BASE).config()["rollout_backend"] == "relax"
    cfg = cli([*vllm, "--vllm-url", "http://127.0.0.1:8000", "http://10.0.0.2:8000",
               "--update-weights-interval", "2", "--use-tis"]).config()
    assert cfg["rollout_backend"] == "vllm" and cfg["update_weights_interval"] == 2
    assert cfg["vllm_url"] == ["http://127.0.0.1:8000", "http://10.0.0.2:8000"]
    # T != 1 without truncation, and truncation at T == 1, both have a log-prob mode
    cli([*vllm, "--rollout-temperature", "0.7"]).config()
    cli([*vllm, "--rollout-top-p", "0.9", "--rollout-top-k", "5"]).config()
    # LoRA adapters are loaded by name, FSDP2 shards gathered in buckets of the given size
    assert cli([*vllm, "--lora-rank", "4"]).config()["lora_rank"] == 4
    cfg = cli([*vllm, "--fsdp", "--weight-sync-bucket-mb", "8"]).config()
    assert cfg["fsdp"] and cfg["weight_sync_bucket_mb"] == 8
    # multi-turn episodes: every turn is sampled by the server
    assert cli([*vllm, "--env", "tests.rollout.agents.scripted:countdown"]).config()["env"]
    # partial rollouts: rounds of --vllm-partial-chunk-tokens
    cfg = cli([*vllm, "--partial-rollout", "--use-tis", "--over-sampling-batch-size", "64",
               "--vllm-partial-chunk-tokens", "4"]).config()
    assert cfg["partial_rollout"] and cfg["vllm_partial_chunk_tokens"] == 4
    # agent programs: the endpoint forwards each turn to the server
    assert cli([*vllm, "--use-agentic-rollout", "--agent-command",
                "python agent.py"]).config()["use_agentic_rollout"]


@pytest.mark.parametrize("flags, needles", [
    (["--vllm-partial-chunk-tokens", "8"], ("--vllm-partial-chunk-tokens 8",
                                            "without --partial-rollout")),
    (["--partial-rollout", "--use-tis", "--over-sampling-batch-size", "64",
      "--vllm-partial-chunk-tokens", "0"],
     ("--vllm-partial-chunk-tokens 0", ">= 1 tokens")),
    (["--lora-rank", "1024"], ("--rollout-backend vllm --lora-rank 1024", "up to rank 512")),
    (["--lora-rank", "4", "--vllm-weight-sync", "collective"],
     ("--vllm-weight-sync collective", "--lora-rank 4", "adapter")),
    (["--vllm-weight-sync", "memory"], ("--vllm-weight-sync", "memory")),
    (["--weight-sync-bucket-mb", "0"], ("--weight-sync-bucket-mb 0", "> 0")),
    (["--rollout-temperature", "0.7", "--rollout-top-p", "0.9"],
     ("--rollout-temperature 0.7", "--rollout-top-p 0.9", "before top-p/top-k truncation")),
    (["--vllm-url", "localhost:8000"], ("--vllm-url localhost:8000", "http(s) URL")),
    # urlsplit raises on the first, reading the port on the second: one line, no traceback
    (["--vllm-url", "http://[::1"], ("--vllm-url http://[::1", "not a URL (Invalid IPv6 URL)")),
    (["--vllm-url", "http://127.0.0.1:99999"], ("--vllm-url http://127.0.0.1:99999",
                                                "not a URL (Port out of range")),
    (["--vllm-startup-timeout", "0"], ("--vllm-startup-timeout 0",)),
    (["--update-weights-interval", "2"], ("--update-weights-interval 2", "--use-tis")),
    (["--update-weights-interval", "0"], ("--update-weights-interval 0", ">= 1")),
])
def test_refused_with_one_line(cli, rejected, vllm, flags, needles):
    rejected(cli([*vllm, *flags]), *needles)


def test_fully_async_rollout_ranks_each_need_a_server(cli, rejected, vllm, monkeypatch):
    """--fully-async: the rollout ranks own the servers, one each (owned, or one URL per
    rollout rank: two ranks sharing one would reload it under each other's requests)."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    lagless = [*vllm, "--fully-async", "--max-staleness", "0", "--rollout-num-gpus", "2"]
    cfg = cli(lagless).config()
    assert cfg["fully_async"] and cfg["rollout_backend"] == "vllm" and cfg["world_size"] == 2
    urls = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert cli([*lagless, "--vllm-url", *urls]).config()["vllm_url"] == urls
    rejected(cli([*lagless, "--vllm-url", urls[0]]),
             "--vllm-url http://127.0.0.1:8000", "--rollout-num-gpus 2",
             "1 server(s) for 2 rollout ranks", "at least one URL per rollout rank")


def test_vllm_needs_a_model_directory(cli, rejected):
    rejected(cli([*BASE, "--rollout-backend", "vllm"]), "--rollout-backend vllm",
             "--hf-checkpoint")


@pytest.mark.parametrize("flags", [["--vllm-url", "http://127.0.0.1:8000"],
                                   ["--vllm-request-timeout", "5"],
                                   ["--vllm-partial-chunk-tokens", "8"],
                                   ["--update-weights-interval", "2"],
                                   ["--weight-sync-bucket-mb", "8"],
                                   ["--vllm-weight-sync", "disk"]])
def test_backend_flags_need_the_backend(cli, rejected, flags):
    rejected(cli([*BASE, *flags]), flags[0], "has no effect")


def test_log_probs_mode_follows_the_temperature():
    # raw log-probs are softmax(z) (T == 1); processed ones are softmax(z / T) after
    # truncation, which validation leaves only when there is no truncation
    assert log_probs_mode(1.0) == "raw_logprobs"
    assert log_probs_mode(0.7) == "processed_logprobs"


def test_rollout_bf16_sets_the_sampler_apart_from_the_trainer(cli, vllm):
    """--rollout-bf16 / --no-rollout-bf16: the sampler's precision (Relax's engine, an owned
    vLLM server); unset, it follows the trainer's resolved --bf16 (relax/precision.py)."""
    assert cli(BASE).config()["rollout_bf16"] is None
    assert cli([*BASE, "--rollout-bf16"]).config()["rollout_bf16"] is True
    assert cli([*BASE, "--bf16", "--no-rollout-bf16"]).config()["rollout_bf16"] is False
    assert cli([*vllm, "--rollout-bf16"]).config()["rollout_bf16"] is True  # owned servers
    for flag, trainer, sampler in ((None, False, False), (None, True, True),
                                   (True, False, True), (False, True, False),
                                   (True, True, True), (False, False, False)):
        assert use_rollout_bf16(flag, trainer) is sampler


@pytest.mark.parametrize("flag", ["--rollout-bf16", "--no-rollout-bf16"])
def test_rollout_bf16_is_refused_with_servers_not_relax_s(cli, rejected, vllm, flag):
    # a --vllm-url server's dtype is its user's: Relax cannot set it
    rejected(cli([*vllm, flag, "--vllm-url", "http://127.0.0.1:8000"]), flag, "--vllm-url",
             "servers Relax starts")


def test_the_weight_sync_defaults_to_collective_for_owned_servers_only(cli, vllm):
    """Owned servers stream (Relax starts them with the plugin's engine); a --vllm-url
    server reloads from disk unless the flag says otherwise (its start-up flags are its
    user's); both choices are accepted either way."""
    url = "http://127.0.0.1:8000"
    assert weight_sync(BackendSection(rollout_backend="vllm")) == "collective"
    assert weight_sync(BackendSection(rollout_backend="vllm", vllm_url=(url,))) == "disk"
    assert weight_sync(BackendSection(rollout_backend="vllm", vllm_url=(url,),
                                      vllm_weight_sync="collective")) == "collective"
    assert weight_sync(BackendSection(rollout_backend="vllm",
                                      vllm_weight_sync="disk")) == "disk"
    assert cli([*vllm, "--vllm-url", url, "--vllm-weight-sync",
                "collective"]).config()["vllm_weight_sync"] == "collective"
    assert cli([*vllm, "--lora-rank", "4", "--vllm-weight-sync",
                "disk"]).config()["vllm_weight_sync"] == "disk"


def test_vllm_num_servers_counts_the_owned_servers(cli, rejected, vllm, monkeypatch):
    """--vllm-num-servers: any number >= 1 of owned servers, none with --vllm-url (those are
    the user's), and under --fully-async at least one per rollout rank (each reloads its own
    on its schedule)."""
    assert cli(vllm).config()["vllm_num_servers"] is None  # one per rank
    assert cli([*vllm, "--vllm-num-servers", "3"]).config()["vllm_num_servers"] == 3
    rejected(cli([*vllm, "--vllm-num-servers", "0"]), "--vllm-num-servers 0", ">= 1 servers")
    rejected(cli([*vllm, "--vllm-num-servers", "2", "--vllm-url", "http://127.0.0.1:8000"]),
             "--vllm-num-servers 2 --vllm-url http://127.0.0.1:8000", "remove one of them")
    rejected(cli([*BASE, "--vllm-num-servers", "2"]), "--vllm-num-servers 2", "has no effect")
    monkeypatch.setenv("WORLD_SIZE", "4")
    lagless = [*vllm, "--fully-async", "--max-staleness", "0", "--rollout-num-gpus", "2"]
    assert cli([*lagless, "--vllm-num-servers", "3"]).config()["vllm_num_servers"] == 3
    rejected(cli([*lagless, "--vllm-num-servers", "1"]), "--vllm-num-servers 1",
             "--rollout-num-gpus 2", "1 server(s) for 2 rollout ranks",
             "at least one server per rollout rank")
