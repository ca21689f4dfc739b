"""The systems `codespec bench` compares, by name (no heavy imports: the CLI's parser
lists them before anything loads; suite.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass

from codespec.bench import llamacpp

PLAIN = "plain"

@dataclass(frozen=True)
class SystemSpec:
    name: str
    description: str
    kind: str  # "plain", "hf", "codespec" or "llamacpp"
    drafter: str = ""  # codespec: "prompt", "index" or "arctic"; hf: "lookup" or "assisted"
    policy: str = "chain"
    quantize: str | None = None  # the row decoder's weights; None: the loaded model's (--quantize)
    draft_model: bool = False  # the draft model (--draft-model) drafts too


SYSTEMS: tuple[SystemSpec, ...] = (
    SystemSpec(PLAIN, "no speculation, no prompt cache", "plain"),
    SystemSpec("hf_prompt_lookup", "transformers prompt lookup, 10 tokens", "hf", "lookup"),
    SystemSpec("hf_assisted", "transformers assisted generation, the draft model", "hf", "assisted",
               draft_model=True),
    SystemSpec("codespec-prompt", "own context, chains", "codespec", "prompt", "chain"),
    SystemSpec("codespec-index", "+ repository index, past generations", "codespec", "index", "chain"),
    SystemSpec("codespec-tree", "+ token trees", "codespec", "index", "tree"),
    SystemSpec("codespec", "+ goodput controller (default)", "codespec", "index", "goodput"),
    SystemSpec("codespec-draft", "+ the draft model (--draft-model)", "codespec", "index", "goodput",
               draft_model=True),
    SystemSpec("arctic-tree", "arctic-inference suffix tree, trees", "codespec", "arctic", "tree"),
    SystemSpec("llamacpp", "llama.cpp llama-server, BF16 GGUF", "llamacpp"),
    SystemSpec("llamacpp-simple", "llama.cpp n-gram lookup: ngram-simple", "llamacpp"),
    SystemSpec("llamacpp-mod", "llama.cpp n-gram lookup: ngram-mod", "llamacpp"),
    SystemSpec("llamacpp-map-k", "llama.cpp n-gram lookup: ngram-map-k", "llamacpp"),
)
SYSTEM_NAMES = tuple(s.name for s in SYSTEMS)
# With --quantize int8, plain decoding on the bf16 weights runs too: the reference for how
# far int8's output strays (requests identical, tokens before the first difference).
BF16_REFERENCE = SystemSpec("plain-bf16", "bf16 weights, no speculation: what --quantize changes", "plain",
                            quantize="none")
ALIASES = {"llamacpp-lookup": llamacpp.LOOKUP_SYSTEMS}  # --systems shorthands
