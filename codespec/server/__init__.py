"""The HTTP endpoint: OpenAI- and llama.cpp-compatible routes over the shared scheduler."""
