"""Re-export for the server engine until it imports pyllama_so.generation.sequence."""

from pyllama_so.generation.sequence import common_prefix

__all__ = ["common_prefix"]
