"""The OpenAI-compatible LLM gateway (issue 28): LLM functions called with OpenAI clients."""
