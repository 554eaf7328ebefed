"""Re-export for the server engine until it imports pyllama_so.generation.text."""

from pyllama_so.generation.text import CONTEXT, TextStream

__all__ = ["CONTEXT", "TextStream"]
