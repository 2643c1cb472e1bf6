"""Rewards: every way a sample gets its reward -- the math and built-in tasks' rewards and user
functions by path (rewards.py, math_reward.py), group rewards (group_rewards.py), reward
servers (remote_reward.py), the generative judge (genrm.py, judge.py), and the Scorer that
applies them, their failures and the post-process plug-in to a step (scoring.py). Loading and
checking user code is relax/plugins.py's.
"""
