"""`codespec bench`: the evidence, measured side by side in one run.

    codespec bench                                   # 4 workloads x all systems: table + JSON line
    codespec bench --workloads edit,repo --repeat 3 --out results/
    codespec bench verify --batches 8 --repeat 3     # draft policies at batch 1 and 8
    codespec bench index --out results/              # the index at 10k..10M tokens
    codespec bench cold --requests 12                # fresh `codespec generate` processes
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from codespec.bench.systems import ALIASES, SYSTEM_NAMES
from codespec.cli.options import MODEL_FIELDS, SPECULATION_FIELDS, add_settings_arguments, settings_from_args
from codespec.errors import CodespecError
from codespec.forward.profile import cpu_description



def register(commands: Any) -> None:
    p = commands.add_parser("bench", help="measure workloads side by side (default), draft policies (`bench "
                            "verify`) or the suffix index (`bench index`)")
    p.add_argument("suite", nargs="?", choices=("workloads", "index", "verify", "cold", "apply", "next-edit",
                                                "editor", "quality"),
                   default="workloads",
                   help="workloads: repo completion, edit, agent loop, editor session x plain, HF prompt lookup, "
                   "codespec variants, arctic-inference; verify: draft policies (none, chain-4/8/16, tree, goodput) "
                   "at batch 1 and 8; index: the index at 10k..10M tokens; cold: held-out requests, a fresh "
                   "process each (codespec generate, --no-spec, HF prompt lookup): start-up included; apply: agents' "
                   "fast-apply and tool-result requests the same way, with --prediction, and llama.cpp's lookups; "
                   "next-edit: next-edit requests from real code, latency and the exact-edit rate; "
                   "quality: line and block completions from real code, exact match and edit similarity per prompt "
                   "layout (codespec's, llama.vim's, the repository layout), with and without repository context "
                   "(--model picks the model); editor: a "
                   "typing replay against codespec lsp, codespec serve's /infill and llama-server (llama.vim's "
                   "requests)")
    p.add_argument("--sets", default="edit,fim-repo", help="verify suite: request sets (edit, fim-repo)")
    p.add_argument("--batches", default="1,8", help="verify suite: concurrent requests per run (default 1,8)")
    p.add_argument("--requests", type=int, default=8, metavar="N",
                   help="verify suite: requests per set, run at each batch size; cold suite: held-out requests, "
                   "half FIM, half edit, spread over the set (default 8); editor suite: the replay's first N "
                   "completion requests (0: all 99)")
    p.add_argument("--received", action="store_true",
                   help="quality suite: score the answers as an editor receives them, from codespec lsp and from "
                   "llama-server with llama.vim's request on the same model, instead of the prompt layouts")
    p.add_argument("--layout", default=None, choices=("sweep", "zeta", "instruct"),
                   help="next-edit suite: the prompt layout (default: the server's)")
    p.add_argument("--sizes", default="10k,100k,1M,10M", help="index suite: corpus sizes (default 10k,100k,1M,10M)")
    p.add_argument("--workloads", default="repo,edit,agent,editor",
                   help="comma-separated: repo, edit, agent, editor (default all)")
    p.add_argument("--systems", default=",".join(SYSTEM_NAMES),
                   help=f"comma-separated, plain always included: {', '.join(SYSTEM_NAMES)}; "
                   "llamacpp-lookup = the three llama.cpp lookup types; the next-edit suite's peers: "
                   "hf_prompt_lookup, llamacpp-simple, llamacpp-mod, llamacpp-map-k")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="timed runs per system, reported by the median (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="override every request's token limit (workloads: repo 128, edit/agent 320, editor 48; "
                   "verify: 96)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write the results as JSON and PNG plots into DIR")
    add_settings_arguments(p, MODEL_FIELDS + SPECULATION_FIELDS)
    p.set_defaults(handler=run)


def _pick(value: str, known: Any, what: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise CodespecError(f"--{what}: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(known)}")
    return names


def run(args: argparse.Namespace) -> int:
    return {"index": run_index, "verify": run_verify, "cold": run_cold, "apply": run_apply,
            "next-edit": run_next_edit, "editor": run_editor, "quality": run_quality}.get(args.suite, run_workloads)(args)


def run_quality(args: argparse.Namespace) -> int:
    from codespec.bench import quality
    from codespec.engine.engine import Engine
    from codespec.engine.run import GenerationConfig
    from codespec.forward import select as forward
    from codespec.prompts import fim_end_ids

    if importlib.util.find_spec("rapidfuzz") is None:
        raise CodespecError("the quality suite scores with rapidfuzz: pip install 'codespec[bench]'")
    settings = settings_from_args(args)
    out_dir = _out_dir(args.out)
    if args.received:
        return run_received(args, settings, out_dir)
    loaded = forward.load(settings)
    engine = Engine.from_settings(loaded.forward, loaded.tokenizer, settings)
    engine.calibrate()
    # --requests N: N cases per kind and target file; its default (8, the verify suite's) means PER_FILE
    chosen = quality.cases(quality.PER_FILE if args.requests == 8 else max(1, args.requests))
    print(f"quality suite: {len(chosen)} cases x {len(quality.LAYOUTS)} layouts x (without, with context), "
          f"{loaded.name}", file=sys.stderr)
    ends = fim_end_ids(loaded.tokenizer)

    def generate(ids: list[int], new: int) -> str:
        # greedy, with speculation: the same text as plain decoding, sooner
        return engine.generate(ids, GenerationConfig(max_new_tokens=new, end_ids=ends)).text

    def progress(s: Any) -> None:
        print(f"  {s.case.kind} {s.case.name} {s.layout}{' +context' if s.with_context else ''}: exact {s.exact}, "
              f"similarity {s.similarity:.2f}", file=sys.stderr, flush=True)

    facts = quality.summary(quality.run_cases(generate, loaded.tokenizer, chosen, quality.LAYOUTS, progress))
    machine = _machine()
    print(f"\ncompletion quality, {loaded.name} (greedy; exact match / edit similarity)")
    for key, row in facts.items():
        print(f"  {key:20} " + "  ".join(f"{kind}: {v['exact']:.2f} / {v['similarity']:.2f} ({v['cases']})"
                                          for kind, v in row.items()))
    report = {"bench": "quality", "model": loaded.name, "machine": machine, "summary": facts}
    if out_dir is not None:
        write_json(out_dir / f"quality-{loaded.name.lower()}.json", report)
    print(json.dumps(report))
    return 0


def run_received(args: argparse.Namespace, settings: Any, out_dir: Path | None) -> int:
    """`bench quality --received`: the cases through codespec lsp and llama-server (bench/received.py)."""
    import tempfile

    from codespec.bench import llamacpp, quality, received
    from codespec.models.default import packaged
    from codespec.settings import child_environment

    chosen = quality.cases(quality.PER_FILE if args.requests == 8 else max(1, args.requests))
    model = packaged(settings.model)
    gguf = None
    if model is not None and llamacpp.server_binary().exists():
        gguf = llamacpp.ensure_gguf(model, log=lambda line: print(line, file=sys.stderr))
    env = child_environment(CODESPEC_MODEL=settings.model, CODESPEC_CACHE_DIR=str(settings.cache_dir),
                            CODESPEC_DRAFT_MODEL=settings.draft_model)
    print(f"quality as received: {len(chosen)} cases through {', '.join(received.SYSTEMS)}, model {settings.model}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="codespec-received-") as root:
        results = received.run(chosen, received.SYSTEMS, Path(root), env, gguf,
                               lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    facts = received.summary(chosen, results)
    print(f"\ncompletion quality as received, {settings.model} (exact match / edit similarity, shown, latency p50)")
    for system, row in facts.items():
        if "skipped" in row:
            print(f"  {system:14} skipped: {row['skipped']}")
            continue
        print(f"  {system:14} " + "  ".join(
            f"{kind}: {v['exact']:.2f} / {v['similarity']:.2f} (shown {v['shown']:.2f}, p50 {v['latency_p50_s']} s)"
            for kind, v in row.items()))
    report = {"bench": "quality-received", "model": settings.model, "machine": _machine(), "summary": facts}
    if out_dir is not None:
        write_json(out_dir / f"quality-received-{settings.model.lower()}.json", report)
    print(json.dumps(report))
    return 0


def run_next_edit(args: argparse.Namespace) -> int:
    from codespec.bench import next_edit
    from codespec.bench.llamacpp import LOOKUP_SYSTEMS, llamacpp_available
    from codespec.bench.peers import hf_prompt_lookup
    from codespec.engine.engine import Engine
    from codespec.forward import select as forward
    from codespec.nextedit.prompt import layout_for
    from codespec.policy.warm import warm_up

    settings = settings_from_args(args)
    layout = args.layout or layout_for(settings.next_edit_layout, settings.model)
    out_dir = _out_dir(args.out)
    # --systems names the peers (plain and codespec always run); its default: all of them
    known = ("hf_prompt_lookup", *LOOKUP_SYSTEMS)
    named = known if args.systems == ",".join(SYSTEM_NAMES) else [
        n for n in _pick(args.systems.replace("llamacpp-lookup", ",".join(LOOKUP_SYSTEMS)),
                         ("plain", "codespec", *known), "systems") if n in known]
    # transformers' model only for the prompt-lookup peer
    loaded = forward.load(settings, transformers="hf_prompt_lookup" in named)
    engine = Engine.from_settings(loaded.forward, loaded.tokenizer, settings)
    engine.calibrate()
    warm_up()
    # --requests N: N requests spread over the kinds; its default (8, the verify suite's) means the full set
    per_kind = next_edit.PER_KIND if args.requests == 8 else max(1, args.requests // len(next_edit.KINDS))
    chosen = next_edit.cases(per_kind)
    print(f"next-edit suite: {len(chosen)} requests, layout {layout}", file=sys.stderr)

    def hf(ids: list[int], new: int, _earlier: list[int]) -> tuple[list[int], float]:
        out = hf_prompt_lookup(loaded.model, ids, new, engine.eos_token_ids)
        return out.token_ids, out.wall_s

    def progress(answer: Any) -> None:
        print(f"  {answer.case.kind} {answer.case.name} {answer.system}: {answer.latency_s * 1000:.0f} ms, "
              f"{len(answer.tokens)} tokens, exact {answer.exact}", file=sys.stderr, flush=True)

    peers: dict[str, Any] = {"hf_prompt_lookup": lambda: contextlib.nullcontext(hf)} \
        if "hf_prompt_lookup" in named else {}
    lookups = [n for n in LOOKUP_SYSTEMS if n in named]
    missing = llamacpp_available() if lookups else None
    if missing is not None:
        print(f"next-edit suite: no llama.cpp rows: {missing}", file=sys.stderr)
    for system in lookups if missing is None else ():  # llama.cpp's lookups: one server each, in turn
        peers[system] = functools.partial(_llama_peer, system, settings.threads or os.cpu_count() or 1,
                                          engine.eos_token_ids)
    answers = next_edit.run_cases(engine, loaded.tokenizer, chosen, layout, peers, progress)
    facts = next_edit.summary(answers)
    machine = _machine()
    print(f"\nnext-edit requests ({layout} layout), {machine['cores']} cores ({machine['cpu']}), warm, one process")
    for system in ("plain", "codespec", "hf_prompt_lookup", *LOOKUP_SYSTEMS):
        row = facts.get(system)
        if row:
            print(f"  {system}: first {row['first_s'] * 1000:.0f} ms, p50 {row['p50_s'] * 1000:.0f} ms, "
                  f"p95 {row['p95_s'] * 1000:.0f} ms, tokens/pass {row.get('tokens_per_pass', '-')}, "
                  f"exact {row['exact_by_kind']}")
    print(f"  codespec identical to plain: {facts['identical']}; codespec {facts.get('codespec_vs_plain')}x plain")
    report = {"bench": "next-edit", "model": loaded.name, "layout": layout, "machine": machine, "summary": facts}
    if out_dir is not None:
        write_json(out_dir / f"next-edit-{layout}.json", report)
    print(json.dumps(report))
    return 0


@contextlib.contextmanager
def _llama_peer(system: str, threads: int, eos: Any) -> Iterator[Any]:
    """A llama-server for `system` while its requests run: each request after the request
    made before it (untimed), so that its prompt cache holds what codespec's does."""
    from codespec.bench.llamacpp import LlamaServer

    with LlamaServer(system, threads=threads) as server:
        def complete(ids: list[int], new: int, earlier: list[int]) -> tuple[list[int], float]:
            server.complete(earlier, 1, eos, cache_prompt=True)
            out = server.complete(ids, new, eos, cache_prompt=True)
            return out.token_ids, out.wall_s
        yield complete


def run_editor(args: argparse.Namespace) -> int:
    import tempfile

    from codespec.bench import editor
    from codespec.bench.typing import typing_replay, write_workspace

    systems = _pick(args.systems, editor.EDITOR_SYSTEMS, "systems") if args.systems != ",".join(SYSTEM_NAMES) \
        else list(editor.EDITOR_SYSTEMS)
    replay = typing_replay(limit=None if args.requests == 0 else args.requests)
    out_dir = _out_dir(args.out)
    print(f"editor suite: {len(replay.asks)} completion requests while typing {len(replay.events)} events x "
          f"{', '.join(systems)}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="codespec-editor-") as tmp:
        root = write_workspace(Path(tmp) / "workspace", replay)
        results = editor.run_editor_bench(replay, systems, root,
                                          lambda m: print("  " + m, file=sys.stderr, flush=True))
    machine = _machine()
    print(f"\ntyping replay: {len(replay.asks)} requests, {machine['cores']} cores ({machine['cpu']}); latency "
          "from request to answer on the client's side; first = first request after a file opened")
    editor.print_table(results, sys.stdout)
    record = {"suite": "editor", "machine": machine, "requests": len(replay.asks),
              "results": [r.to_json() for r in results]}
    print(json.dumps(record))
    if out_dir is not None:
        write_json(out_dir / "editor.json", record)
    unanswered = [r.system for r in results if any(s.latency_s is None for s in r.samples)]
    if unanswered:
        print(f"unanswered requests: {', '.join(unanswered)}", file=sys.stderr)
        return 1
    return 0


def run_cold(args: argparse.Namespace) -> int:
    from codespec.bench import cold
    from codespec.bench.heldout import heldout_requests

    if args.requests < 2:
        raise CodespecError("cold suite: --requests must be at least 2")

    def chosen(tokenizer: Any) -> list[Any]:
        held = heldout_requests(tokenizer)
        return [*_spread([r for r in held if r.kind == "fim"], args.requests // 2),
                *_spread([r for r in held if r.kind == "edit"], args.requests - args.requests // 2)]

    return _fresh_processes(args, "cold", cold.COLD_SYSTEMS, chosen)


def run_apply(args: argparse.Namespace) -> int:
    from codespec.bench import cold
    from codespec.bench.apply import apply_requests
    from codespec.bench.llamacpp import llamacpp_available

    systems = cold.APPLY_SYSTEMS
    why = llamacpp_available()
    if why is not None and args.systems == ",".join(SYSTEM_NAMES):  # the default set: without what is missing
        print(f"apply suite: no llama.cpp lookups ({why})", file=sys.stderr)
        systems = tuple(s for s in systems if not s.startswith("llamacpp"))
    return _fresh_processes(args, "apply", systems, apply_requests, known=cold.APPLY_SYSTEMS)


def _fresh_processes(args: argparse.Namespace, suite: str, default_systems: Sequence[str],
                     requests_of: Any, known: Sequence[str] | None = None) -> int:
    """The cold and apply suites: every request in fresh processes under each system."""
    from codespec.bench import cold
    from codespec.models.loading import load_tokenizer

    systems = _pick(args.systems, known or default_systems, "systems") if args.systems != ",".join(SYSTEM_NAMES) \
        else list(default_systems)
    systems = ["plain", *[s for s in systems if s != "plain"]]
    repeat = 1 if args.repeat is None else args.repeat
    if repeat < 1:
        raise CodespecError(f"{suite} suite: --repeat must be at least 1")
    out_dir = _out_dir(args.out)
    settings = settings_from_args(args)
    tokenizer = load_tokenizer(settings)
    chosen = requests_of(tokenizer)
    print(f"{suite} suite: {len(chosen)} requests x {', '.join(systems)}, a fresh process each, "
          f"{repeat} round(s)", file=sys.stderr)

    def progress(run: Any) -> None:
        print(f"  {run.request} {run.system}: {len(run.token_ids)} tokens, {run.wall_s:.1f} s wall, "
              f"{run.model_load_s:.1f} s load, first token at {run.first_token_s:.1f} s", file=sys.stderr, flush=True)

    result = cold.run_cold(settings, tokenizer, chosen, systems, repeat, progress)
    found = cold.checks(result, systems)
    facts = cold.summary(result, systems)
    machine = _machine()
    print(f"\n{len(chosen)} requests, a fresh process each, {machine['cores']} cores ({machine['cpu']}), "
          f"median of {repeat}; net = wall - model load (seconds)")
    print(cold.format_table(result, systems))
    for system in systems:
        f = facts.get(system)
        if f:
            print(f"  {system}: cold start to first token {f['cold_start_to_first_token_s']:.2f} s (median), "
                  f"model load {f['median_model_load_s']:.2f} s")
    for name, ok in found.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    report = {"bench": suite, "machine": machine, "systems": systems, "summary": facts, "checks": found}
    if out_dir is not None:
        write_json(out_dir / f"{suite}.json", report)
        print(f"wrote {out_dir / f'{suite}.json'}", file=sys.stderr)
    print(json.dumps(report))
    return 0


def _spread(items: list[Any], count: int) -> list[Any]:
    if count >= len(items):
        return items
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def _parse_size(text: str) -> int:
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise CodespecError(f"--sizes: {text!r} is not a size such as 10k or 1M") from None
    if value < 1000:
        raise CodespecError(f"--sizes: {text!r} is below 1k tokens")
    return value


def run_index(args: argparse.Namespace) -> int:
    from codespec.bench.index_bench import format_index_table, run_index_bench, stderr
    from codespec.models.loading import load_tokenizer

    sizes = tuple(_parse_size(s.strip()) for s in args.sizes.split(",") if s.strip())
    out_dir = _out_dir(args.out)
    settings = settings_from_args(args)
    results = run_index_bench(load_tokenizer(settings), settings.cache_dir, sizes, stderr)
    print(f"\nsuffix index, real code (stdlib + installed packages), {platform.machine()}, "
          f"{os.cpu_count()} cores; drafts of 32 tokens after 32-token held-out contexts")
    print(format_index_table(results))
    report = {"bench": "index", "machine": _machine(), "results": results}
    if out_dir is not None:
        from codespec.bench.plots import index_latency_plot

        write_json(out_dir / "index.json", report)
        plot = index_latency_plot(results, out_dir / "index_latency.png",
                                  f"suffix index on real code, {platform.machine()}, {os.cpu_count()} cores")
        print(f"wrote {out_dir / 'index.json'} and {plot}", file=sys.stderr)
    print(json.dumps(report))
    return 0


def run_workloads(args: argparse.Namespace) -> int:
    from codespec.bench.sessions import WORKLOADS
    from codespec.forward import select as forward
    from codespec.bench.suite import Context, available_systems, bar_checks, format_table, run_suite

    workload_names = _pick(args.workloads, WORKLOADS, "workloads")
    from codespec.engine.drafter import draft_model_of

    settings = settings_from_args(args)
    chosen, skipped = available_systems(_pick(args.systems, (*SYSTEM_NAMES, *ALIASES), "systems"),
                                        draft_model_of(settings))
    args.repeat = 1 if args.repeat is None else args.repeat
    if args.repeat < 1:
        raise CodespecError(f"--repeat must be at least 1, got {args.repeat}")
    out_dir = _out_dir(args.out)
    loaded = forward.load(settings, transformers=True)  # the peers run transformers' model
    workloads = [WORKLOADS[name](loaded.tokenizer) for name in workload_names]
    if args.max_new_tokens is not None:
        from dataclasses import replace

        for w in workloads:
            w.steps = [replace(step, max_new_tokens=args.max_new_tokens) for step in w.steps]
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", file=sys.stderr)
    for w in workloads:
        print(f"workload {w.name}: {w.description}; {len(w.steps)} requests", file=sys.stderr)
    ctx = Context(loaded, settings, slot_tokens=4096)
    if settings.quantize != "none":  # how far the quantized output strays from bf16's
        from codespec.bench.systems import BF16_REFERENCE

        chosen.insert(1, BF16_REFERENCE)

    def progress(run: Any) -> None:
        print(f"  {run.workload} {run.system}: {run.tokens} tokens in {run.wall_s:.1f} s "
              f"({len(run.requests)} requests)", file=sys.stderr, flush=True)

    results = run_suite(ctx, workloads, chosen, args.repeat, on_run=progress)
    checks = bar_checks(results)
    machine = _machine()
    weights = "" if settings.quantize == "none" else f", weights {settings.quantize}"
    print(f"\nmodel {loaded.name} ({loaded.info()['dtype']}{weights}, {loaded.forward.device}), {machine['cores']} cores "
          f"({machine['cpu']}), {machine['torch_threads']} threads, median of {args.repeat}")
    print(format_table(results))
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    report = {
        "bench": "workloads",
        "model": loaded.name,
        "dtype": loaded.info()["dtype"],
        "machine": machine,
        "backend": _backend(loaded),
        "settings": {"quantize": settings.quantize, "draft_model": draft_model_of(settings),
                     "max_draft_tokens": settings.max_draft_tokens, "min_match_tokens": settings.min_match_tokens,
                     "prefill_chunk_tokens": settings.prefill_chunk_tokens},
        "workloads": {w.name: {"description": w.description, "requests": [s.name for s in w.steps],
                               "repository_files": len(w.files)} for w in workloads},
        "skipped": skipped,
        "results": [r.to_json() for r in results],
        "checks": checks,
    }
    if out_dir is not None:
        from codespec.bench.plots import speedup_plot

        write_json(out_dir / "workloads.json", report)
        plot = speedup_plot(report["results"], out_dir / "speedup.png",
                            f"{loaded.name} ({loaded.info()['dtype']}), {machine['cores']} cores, "
                            f"median of {args.repeat}")
        print(f"wrote {out_dir / 'workloads.json'} and {plot}", file=sys.stderr)
    print(json.dumps(report))
    return 0


# The CPU features that change which kernels run (the C row decoder, oneDNN's matrix units).
KERNEL_FEATURES = ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx2", "fma", "bf16", "sve")


def _backend(loaded: Any) -> dict[str, Any]:
    """Which backend ran the passes and with what kernel layout (the cuda backend's
    CODESPEC_CUDA_* settings, the row decoder's kernels): the machine profile's key."""
    return {"name": loaded.backend, "reason": loaded.reason,
            "layout": loaded.forward.profile_key().get("layout", "")}


def _cpu_label(machine: dict[str, Any]) -> str:
    """The CPU of a `_machine()` record for a table's header line: "AMD EPYC (family 26 model 2)"."""
    return f"{machine['cpu']} ({machine['cpu_generation']})" if machine["cpu_generation"] else machine["cpu"]


def _machine() -> dict[str, Any]:
    """What a result was measured on: the CPU's kind (not just its architecture: AMX, AVX-512
    BF16 and AVX2-only machines pick different kernels) and the GPU where there is one."""
    import torch

    cpu = cpu_description()
    machine = {
        "cpu": cpu.name,
        "cpu_generation": cpu.generation,
        "cpu_features": [name for name in KERNEL_FEATURES if name in cpu.flags],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        machine.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    return machine


def _out_dir(value: str | None) -> Path | None:
    """--out DIR, created up front so a bad path fails before minutes of measuring."""
    if value is None:
        return None
    path = Path(value)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CodespecError(f"--out: cannot create {path}: {exc.strerror or exc}") from None
    return path


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)  # never a half-written file


def _verify_args(args: argparse.Namespace) -> tuple[list[str], Path | None, list[int]]:
    """The verify suite's sets, output folder and batch sizes (and --repeat), checked."""
    set_names = _pick(args.sets, ("edit", "fim-repo"), "sets")
    out_dir = _out_dir(args.out)
    args.repeat = 1 if args.repeat is None else args.repeat
    if args.repeat < 1:
        raise CodespecError(f"--repeat must be at least 1, got {args.repeat}")
    try:
        batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    except ValueError:
        raise CodespecError(f"--batches: {args.batches!r} is not a list of numbers such as 1,8") from None
    if not batches or batches[0] < 1:
        raise CodespecError("--batches: give positive request counts, such as 1,8")
    if args.requests < batches[-1]:
        raise CodespecError(f"--requests {args.requests} is fewer than the largest batch ({batches[-1]}): "
                            "raise --requests or lower --batches")
    return set_names, out_dir, batches


def run_verify(args: argparse.Namespace) -> int:
    from codespec.bench.batch_bench import bar_checks, format_verify_table, verify_results
    from codespec.forward import select as forward

    set_names, out_dir, batches = _verify_args(args)
    settings = settings_from_args(args)
    loaded = forward.load(settings)
    count = args.requests
    new_tokens = args.max_new_tokens or 96

    def progress(result: Any) -> None:
        j = result.to_json()
        print(f"  {j['set']} batch {j['batch']} {j['system']}: {j['tokens']} tokens in {j['wall_s']:.1f} s, "
              f"{j['accepted_tokens_per_pass']:.2f} tokens/pass", file=sys.stderr, flush=True)

    results = verify_results(loaded, settings, set_names, batches, count, new_tokens, args.repeat, progress)
    checks = bar_checks(results)
    import torch

    machine = _machine()
    print(f"\nmodel {loaded.name} ({loaded.info()['dtype']}, {loaded.forward.device}), {torch.get_num_threads()} threads, "
          f"{_cpu_label(machine)}; {count} requests per set, up to {new_tokens} new tokens each, "
          f"median of {args.repeat}")
    print(format_verify_table(results))
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    report = {"bench": "verify", "model": loaded.name, "dtype": loaded.info()["dtype"], "machine": machine,
              "backend": _backend(loaded), "results": [r.to_json() for r in results], "checks": checks}
    if out_dir is not None:
        write_json(out_dir / "verify.json", report)
        print(f"wrote {out_dir / 'verify.json'}", file=sys.stderr)
    print(json.dumps(report))
    return 0
