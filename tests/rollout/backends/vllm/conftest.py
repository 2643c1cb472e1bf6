"""The vLLM evaluation tests (test_eval_vllm.py) compare against relax eval's own engine on the
same tiny checkpoint as tests/eval/: its fixtures, shared rather than written twice."""

from tests.eval.conftest import tiny, tiny_checkpoint  # noqa: F401
