"""Re-exports for the server modules that still import from here: the rows and formats live in
pyllama_so.generation.logprobs, the callable hooks in pyllama_so.generation.hooks."""

from pyllama_so.generation.hooks import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from pyllama_so.generation.logprobs import (LogprobRows, TokenLogprob, chat_logprobs, completion_logprobs,
                                            prompt_logprob_rows)

__all__ = ["LogitsProcessor", "LogitsProcessorList", "StoppingCriteria", "StoppingCriteriaList", "LogprobRows",
           "TokenLogprob", "chat_logprobs", "completion_logprobs", "prompt_logprob_rows"]
