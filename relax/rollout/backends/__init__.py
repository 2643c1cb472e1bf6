"""Who samples the rollouts (``--rollout-backend``): protocol.py (the interface the trainer,
the rollout ranks and ``relax eval`` call), local.py (Relax's own decoding engine on the
policy's module), vllm/ (vLLM servers fed the trainer's weights) and open.py, the one place
that picks one from the configuration. Uses ``relax.rollout.generation`` only.
"""
