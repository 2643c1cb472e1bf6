"""Prompt formatting: chat template with a system prompt, plain text otherwise."""

from relax.rollout.prompts.data import format_prompt
from relax.tiny_model import build_tokenizer


def test_chat_template_and_system_prompt():
    tok = build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = format_prompt(tok, "1+1=", apply_chat_template=True, system_prompt="Be brief.")
    assert text == "<system>Be brief.\n<user>1+1=\n<assistant>"
    messages = [{"role": "user", "content": "hi"}]
    assert format_prompt(tok, messages, apply_chat_template=True, system_prompt=None) == (
        "<user>hi\n<assistant>")


def test_plain_prompt_is_unchanged():
    assert format_prompt(None, "12+7=", apply_chat_template=False, system_prompt=None) == "12+7="
