"""The generation layer under both fronts: what a sequence's life needs, written once for `Llama` and the
server's engine.

- sequence: the prefix of a prompt a sequence's cache reuses, and cutting it back (a memory that cannot drop a
  suffix starts over);
- limits: the prompt that fits, max_tokens, the context-end rule;
- scoring: prompt scoring (echo with logprobs);
- text: token pieces, completion text and the text stream (UTF-8, stop strings);
- logprobs: logprobs rows and their shapes; hooks: llama-cpp-python's logits processors and stopping criteria;
- sampler: the one factory of a request's llama.cpp sampler chain;
- responses: OpenAI's / llama-cpp-python's completion and chat response and chunk shapes;
- completion, chat: Llama's completion stream and chat completion (with tools) over these.
"""
