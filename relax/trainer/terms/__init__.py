"""The optional terms of a rollout step's training, one module each, behind one protocol
(term.py): the KL terms and the reference pass (kl.py), the entropy bonus (entropy.py), the
sampler corrections and mismatch metrics (off_policy.py), the ``ppo`` critic (critic.py,
critic_weights.py), on-policy distillation's teacher (distillation.py, teacher_server.py),
self-distillation (self_distillation.py) and the custom advantage plug-in
(custom_advantage.py). relax/trainer/build.py picks the configured ones; the loop and the
update iterate them.
"""
