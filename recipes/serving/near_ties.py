"""Are the vLLM benchmark's output divergences near-ties? Each output of `bench_vllm.py` that differs from vLLM's own
without speculation (``none`` at the same concurrency B; and ``none`` at B > 1 against ``none`` at B = 1), classified at
its first differing position by `hf_metasd.lossless.check_divergence`'s rule: with a = the reference's token and b =
the other's, g = z32[a] - z32[b] over the common prefix, epsilon = max_v |z_lowp[v] - z32[v]| there, near-tie iff
|g| <= 2 epsilon (in float32 the tolerance is 0: any divergence is an error).

vLLM hands out no logits, so the logits are recomputed with the Hugging Face model of the same weights folder
(``settings.model`` of the results; by default `hf_metasd.benchmark.offline.load_default_target`'s): z32 in float32,
z_lowp in the results' dtype. **HF transformers' bfloat16 kernels stand in for vLLM's** (an approximation: vLLM's CPU
kernels round in their own order, so its epsilon at a position need not be HF's).

Prompt ids are rebuilt as the bench's ``LLM.chat`` built them: one user turn per prompt (the prompts of the results'
settings, in its order), the model folder's chat template with the generation prompt, no special tokens added.
`hf_metasd.benchmark.offline.chat_prompt` gives these ids; ``--vllm-renderer`` (in vLLM's environment,
``recipes/serving/setup_vllm.sh``) renders them through vLLM's own renderer too and stops unless they are equal. As a
check of the ids, the HF model in the results' dtype is teacher-forced along ``none``'s B = 1 outputs: its argmax
should be vLLM's token at (nearly) every position. Writes ``near_ties.json`` next to the results and prints a table
per method and B.

    python recipes/serving/near_ties.py docs/assets/bench/vllm/bfloat16/results.json
    python recipes/serving/near_ties.py docs/assets/bench/vllm/float32/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
APPROXIMATION = (
    "logits recomputed with HF transformers (CPU): its {dtype} kernels stand in for vLLM's, an approximation "
    "(vLLM rounds in its own order, so its epsilon at a position need not be HF's)"
)


def _prompts(record: dict[str, Any]) -> list[Any]:
    """The bench's prompts, rebuilt from its settings as `bench_vllm._prompts` builds them, checked against the
    record's ids."""
    from hf_metasd.benchmark.prompts import load_bench_prompts, load_prompts_file, mixed_stream

    settings = record["settings"]
    if settings.get("prompts"):
        loaded = load_prompts_file(settings["prompts"])
    else:
        loaded = load_bench_prompts(per_task=settings["per_task"])
    prompts = mixed_stream(loaded)
    prompts = prompts[: settings["limit"]] if settings.get("limit") else prompts
    rebuilt = [{"task": p.task, "id": p.id} for p in prompts]
    if rebuilt != record["prompts"]:
        raise ValueError("the rebuilt prompts are not the results' prompts (ids or order differ)")
    return prompts


def _vllm_ids(model: str, dtype: str, texts: list[str]) -> list[list[int]]:
    """Prompt ids through vLLM's own renderer, as `LLM.chat` renders (chat template, generation prompt, no special
    tokens added), without starting an engine."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers import ChatParams, renderer_from_config

    config = EngineArgs(model=model, dtype=dtype, max_model_len=2048, enforce_eager=True).create_engine_config()
    renderer = renderer_from_config(config)
    chat = ChatParams(
        chat_template=None,
        chat_template_kwargs={
            "add_generation_prompt": True,
            "continue_final_message": False,
            "tools": None,
            "tokenize": False,
        },
    )
    tokenize = renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
    _, inputs = renderer.render_chat([[{"role": "user", "content": t}] for t in texts], chat, tokenize)
    return [list(i["prompt_token_ids"]) for i in inputs]


def _reference_pairs(runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(reference, run) pairs: every method against ``none`` at its B, ``none`` at B > 1 against ``none`` at B = 1."""
    done = [r for r in runs if "outputs" in r]
    none = {r["concurrency"]: r for r in done if r["method"] == "none"}
    pairs = [(none[r["concurrency"]], r) for r in done if r["method"] != "none" and r["concurrency"] in none]
    first = min(none) if none else None
    pairs += [(none[first], none[b]) for b in sorted(none) if b != first]
    return pairs


def _label(reference: dict[str, Any], run: dict[str, Any]) -> str:
    if run["method"] == "none":
        return f"none (against none at B={reference['concurrency']})"
    return run["method"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results.json of bench_vllm.py")
    parser.add_argument("--model", default=None, help="weights folder (default: the results' settings.model)")
    parser.add_argument("--out", type=Path, default=None, help="default: near_ties.json next to the results")
    parser.add_argument("--vllm-renderer", action="store_true", help="also render the prompts through vLLM's renderer")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from hf_metasd.benchmark.offline import chat_prompt, default_cache_dir, load_default_target
    from hf_metasd.lossless import check_divergence

    record = json.loads(args.results.read_text())
    dtype_name = record["settings"]["dtype"]
    model = args.model or record["settings"].get("model") or str(default_cache_dir())
    if not Path(model).is_dir():
        model = str(default_cache_dir())
    torch.set_num_threads(args.threads)
    prompts = _prompts(record)

    target, tokenizer = load_default_target(getattr(torch, dtype_name), cache_dir=model)
    target32 = target if dtype_name == "float32" else load_default_target(torch.float32, cache_dir=model)[0]
    ids = [chat_prompt(tokenizer, p.text)[0].tolist() for p in prompts]
    tokenization = "hf_metasd.benchmark.offline.chat_prompt (the folder's chat template, generation prompt)"
    if args.vllm_renderer:
        if _vllm_ids(model, dtype_name, [p.text for p in prompts]) != ids:
            raise SystemExit("vLLM's renderer gives other prompt ids than chat_prompt")
        tokenization += "; equal to vLLM's renderer on every prompt (--vllm-renderer)"
    print(APPROXIMATION.format(dtype=dtype_name), flush=True)

    def sequence(i: int, output: list[int]) -> torch.Tensor:
        return torch.tensor([ids[i] + output])

    # the ids check: HF in the results' dtype, teacher-forced along none's outputs at the first B; where its argmax is
    # not vLLM's token, the float32 gap between the two (whole logits would say the ids are wrong)
    none_first = next(r for r in sorted(record["runs"], key=lambda r: r["concurrency"]) if r["method"] == "none")
    agree = total = whole = 0
    others = []
    with torch.no_grad():
        for i, output in enumerate(none_first["outputs"]):
            forced = sequence(i, output)
            start = len(ids[i]) - 1
            low = target(forced).logits[0, start:-1].float()
            z32 = low if target32 is target else target32(forced).logits[0, start:-1].float()
            argmax, vllm = low.argmax(-1), torch.tensor(output)
            same = argmax.eq(vllm)
            agree, total, whole = agree + int(same.sum()), total + len(output), whole + bool(same.all())
            for j in (~same).nonzero().flatten().tolist():
                g = float(z32[j, vllm[j]] - z32[j, argmax[j]])
                epsilon = float((low[j] - z32[j]).abs().max())
                others.append({"prompt": prompts[i].id, "position": j, "g": g, "epsilon": epsilon})
    ids_check = {
        "against": f"none at B={none_first['concurrency']}",
        "positions_agreeing": agree,
        "positions": total,
        "outputs_agreeing_throughout": whole,
        "outputs": len(none_first["outputs"]),
        "largest_abs_g_where_not": max((abs(o["g"]) for o in others), default=None),
        "not_agreeing": others,
    }
    largest = ids_check["largest_abs_g_where_not"]
    print(
        f"ids check: HF {dtype_name} argmax (teacher-forced) is vLLM's token at {agree} of {total} positions along "
        f"none's B={none_first['concurrency']} outputs ({whole} of {len(none_first['outputs'])} outputs throughout)"
        + ("" if largest is None else f"; largest float32 gap where not: {largest:.4f}"),
        flush=True,
    )

    divergences, summary = [], []
    for reference, run in _reference_pairs(record["runs"]):
        label = _label(reference, run)
        found = []
        for i, (plain, other) in enumerate(zip(reference["outputs"], run["outputs"])):
            if plain == other:
                continue
            d = check_divergence(target, sequence(i, plain), sequence(i, other), len(ids[i]), target_float32=target32)
            tokens = {
                "reference": None if d.plain_token is None else tokenizer.decode([d.plain_token]),
                "here": None if d.token is None else tokenizer.decode([d.token]),
            }
            row = {
                "method": run["method"],
                "B": run["concurrency"],
                "reference": f"none at B={reference['concurrency']}",
                "prompt": prompts[i].id,
                "task": prompts[i].task,
                "position": d.position,
                "reference_token": d.plain_token,
                "token": d.token,
                "tokens": tokens,
                "g": None if d.gap != d.gap else d.gap,  # nan (one had stopped): null
                "epsilon": d.tolerance / 2,
                "tolerance": d.tolerance,
                "near_tie": d.near_tie,
            }
            found.append(row)
            print(f"{label} B={run['concurrency']} {prompts[i].id}: {d.describe(tokenizer)}", flush=True)
        divergences += found
        gaps = [abs(r["g"]) for r in found if r["g"] is not None]
        summary.append(
            {
                "method": label,
                "B": run["concurrency"],
                "outputs": len(run["outputs"]),
                "divergences": len(found),
                "near_ties": sum(r["near_tie"] for r in found),
                "largest_abs_g": max(gaps, default=None),
                "not_near_ties": sum(not r["near_tie"] for r in found),
            }
        )

    lines = [
        "| method | B | outputs | divergences | near-ties | largest abs(g) | not near-ties |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        largest = "" if s["largest_abs_g"] is None else f"{s['largest_abs_g']:.3f}"
        lines.append(
            f"| {s['method']} | {s['B']} | {s['outputs']} | {s['divergences']} | {s['near_ties']} | {largest} "
            f"| {s['not_near_ties']} |"
        )
    table = "\n".join(lines)
    total_found = len(divergences)
    near = sum(d["near_tie"] for d in divergences)
    print(f"\n{args.results} ({dtype_name}): {total_found} divergences, {near} near-ties, {total_found - near} not")
    print(table)

    result = {
        "results": str(args.results),
        "dtype": dtype_name,
        "model": model,
        "logits": APPROXIMATION.format(dtype=dtype_name),
        "rule": "hf_metasd.lossless.check_divergence: g = z32[a] - z32[b] on the common prefix, epsilon = "
        "max |z_lowp - z32| there, near-tie iff |g| <= 2 epsilon (float32: any divergence is an error)",
        "tokenization": tokenization,
        "ids_check": ids_check,
        "summary": summary,
        "divergences": divergences,
    }
    out = args.out or args.results.parent / "near_ties.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main()
