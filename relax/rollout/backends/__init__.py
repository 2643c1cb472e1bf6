"""Who samples the rollouts (``--rollout-backend``): vllm/ (vLLM servers fed the trainer's
weights).
"""
