"""Re-export until every importer uses pyllama_so.generation.responses."""

from pyllama_so.generation.responses import (chat_chunks, chat_logprobs, chat_response, tool_call_chunks,
                                             tools_from_functions)

__all__ = ["chat_chunks", "chat_logprobs", "chat_response", "tool_call_chunks", "tools_from_functions"]
