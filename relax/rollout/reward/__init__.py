"""Rewards: every way a sample gets its reward -- the math and built-in tasks' rewards and user
functions by path (rewards.py, math_reward.py), group rewards (group_rewards.py), reward
servers (remote_reward.py), the generative judge (genrm.py, judge.py), the one builder that
picks the source of a run's rewards for training and evaluation (sources.py), and the Scorer
that applies it, its failures and the post-process plug-in to a step (scoring.py). Loading and
checking user code is relax/plugins.py's.
"""
