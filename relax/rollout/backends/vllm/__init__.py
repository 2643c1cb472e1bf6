"""vLLM: ``--rollout-backend vllm`` -- the owned server process (vllm_server.py), the HTTP client
of any server (vllm_client.py), the Sampler interface over it (vllm_sampler.py), a rank's
servers, sampler and weight sync (vllm_backend.py), and the weights sent to the server
(vllm_sync.py) as vllm_weights.py writes them. Starts a server only with that backend.
"""
