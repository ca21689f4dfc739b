"""Structured output: grammars over the model's tokens (llguidance) and tool calls."""
