"""codespec's drafts and front ends on other engines (docs/scale.md).

* `vllm`: a proposer for vLLM V1's `custom_class` speculative method.
* `sglang`: the repository index as SGLang's external n-gram corpus.
* `upstream`: an OpenAI-compatible engine (vLLM, SGLang) behind codespec's front ends.

Nothing here imports vLLM or SGLang: those run in their own environments.
"""
