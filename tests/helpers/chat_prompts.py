"""Chat templates and the prompts they render, shared by the tests of Llama's chat and the server's."""

from __future__ import annotations

# A chat template in the style of transformers' templates: the BOS written by the template, a default system
# prompt, tools as JSON, raise_exception for a role it refuses. RENDERED is what it renders for MESSAGES.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if loop.first and m['role'] != 'system' %}<|system|>\nYou are a tiny test model.{{ eos_token }}\n{% endif %}"
    "{% if m['role'] == 'forbidden' %}{{ raise_exception('the role forbidden is not allowed') }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

MESSAGES = [{"role": "user", "content": "Hello there"}]
# CHAT_TEMPLATE with MESSAGES: the template's BOS, its default system prompt, the user turn, the assistant's start
RENDERED = "<s><|system|>\nYou are a tiny test model.</s>\n<|user|>\nHello there</s>\n<|assistant|>\n"
CHATML = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"

# SmolLM2-135M-Instruct's own template with its default system prompt
SMOLLM2_QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
SMOLLM2_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                  "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
                  "<|im_start|>assistant\n")
