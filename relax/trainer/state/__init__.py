"""Saved state: crash-safe sharded checkpoints, exact resume and the Hugging Face export (docs/reliability.md)."""
