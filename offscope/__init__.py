"""offscope: runtime scope enforcement for LLM agents, with a built-in eval mode."""

__version__ = "0.1.0"
