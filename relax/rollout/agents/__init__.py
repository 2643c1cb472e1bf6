"""Agents: multi-turn episodes -- ``--env`` environments (envs.py) behind their containment
boundary (env_guard.py), the episode loop (episodes.py), and agent programs served by a
localhost Chat Completions endpoint (agent_server.py, with chat_schema.py checking requests,
agent_procs.py running the programs and peer.py telling who calls).
"""
