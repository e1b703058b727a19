"""The lossless contract and MetaSD's per-round costs on one device, with models built from config only (issue 34,
item 6). Nothing is downloaded: the target, the drafters, the feature head and the tokenizers are built in memory from
fixed seeds, so the script runs on a machine with no network (a GPU box) as well as on the 2-core CPU.

1. Models: a random Llama target (6 layers, hidden 384, vocabulary 2048; ``--quick``: 2 layers, hidden 64,
   vocabulary 128) and drafters sharing its vocabulary (2-layer models), in each ``--dtypes`` (built in float32, then
   cast), on ``--device``. The LM heads are scaled up (peaked distributions: a random tiny model is near-uniform,
   and near-ties are what makes batched and one-token passes disagree in low precision).
2. Lossless: for every registered drafter kind (`hf_metasd.drafters.DRAFTER_KINDS`; policy ``fixed`` on its first
   arm, so that every round drafts with that kind), and for one mixed pool of all of them (``mixed/round_robin``:
   every arm drafts in turn; ``mixed/default``: the default policy, whose per-round costs are a user's), MetaSD greedy (`custom_generate=hf_metasd.generate`) must give plain
   greedy `generate`'s tokens on every prompt. On the same prompts transformers' own assisted decoding
   (``assistant_model=`` with the 2-layer drafter) is compared with plain greedy too: in bfloat16 on CUDA a verification
   pass over several tokens can round differently from one-token steps, and that changes the argmax of a near-tie in
   transformers' assisted decoding as well. A row is ``PASS`` (every prompt identical), ``SHARED`` (MetaSD differs
   only on prompts where transformers' assisted decoding differs too), ``FAIL`` (MetaSD differs where transformers does
   not), ``SKIPPED`` (the kind cannot be built here; the reason is given) or ``MISSING`` (a kind registered after this
   script was written: add a builder to `BUILDERS`). The exit code is 1 on any ``FAIL`` or ``MISSING``.
3. Costs, as multiples of one plain target step (one token with a KV cache after a ``--context``-token prompt, median):
   the feature head drafting 1..N tokens after one new target feature, and each row's MetaSD calls per round (their
   ``out.metasd`` telemetry: wall, drafting, verification, policy, reward, and `MetaSDStats.overhead_seconds`: policy,
   reward, replay, catch-up, kernel choice). The first prompt's call is a warm-up and is left out of the costs. On
   CUDA every time is taken after ``torch.cuda.synchronize()``; for the MetaSD calls the script installs a clock that
   synchronizes (`hf_metasd.stats.CLOCK`), so that GPU work is charged to the part that launched it (without it the
   stopwatch sees launch time and the verification's argmax read pays for everything).
4. One markdown table on stdout, and everything as JSON in ``--out``.

    python recipes/benchmarks/gpu_check.py                       # cuda if available, float32 and bfloat16
    python recipes/benchmarks/gpu_check.py --device cpu --quick --dtypes float32   # seconds (the test runs this)
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from torch.nn import functional as F
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import hf_metasd
import hf_metasd.stats
from hf_metasd.drafters import (
    DRAFTER_KINDS,
    CorpusDrafter,
    EarlyExitDrafter,
    FeatureHeadDrafter,
    LoraDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    TokenizerBridgeDrafter,
    TokenRecyclingDrafter,
)
from hf_metasd.feature_head import FeatureHead, FeatureHeadConfig, FeatureRecorder

#: sizes of a full run and of ``--quick``
SIZES = {
    "full": {
        "layers": 6,
        "hidden": 384,
        "vocab": 2048,
        "drafter_layers": 2,
        "prompts": 8,
        "max_new_tokens": 64,
        "context": 64,
        "reps": 30,
        "head_steps": 200,
        "head_tokens": 8,
    },
    "quick": {
        "layers": 2,
        "hidden": 64,
        "vocab": 128,
        "drafter_layers": 1,
        "prompts": 2,
        "max_new_tokens": 12,
        "context": 16,
        "reps": 3,
        "head_steps": 20,
        "head_tokens": 3,
    },
}
CHARS = [chr(c) for c in range(32, 127)]  # the target tokenizer's ids 1..95; 0 is "<s>"
DRAFTER_MERGES = [("t", "h"), ("e", " "), ("a", "n"), ("i", "n"), ("o", "n")]
COST_PARTS = ("wall", "draft", "verify", "policy", "reward", "overhead")


# ---------------------------------------------------------------------------------------------------------------------
# models and tokenizers from config
# ---------------------------------------------------------------------------------------------------------------------
def llama(seed: int, layers: int, hidden: int, vocab: int) -> LlamaForCausalLM:
    """A random Llama (float32, CPU) with a scaled-up LM head (peaked distributions)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64),
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def bpe_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE(vocab, merges))
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>")


def target_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """``"<s>"``, the 95 printable characters, then 2-character merges up to `size` ids: every target id decodes."""
    vocab = {"<s>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    merges = [(a, b) for a in CHARS for b in CHARS][: size - len(vocab)]
    vocab.update({a + b: len(vocab) + i for i, (a, b) in enumerate(merges)})
    return bpe_tokenizer(vocab, merges)


def drafter_tokenizer() -> PreTrainedTokenizerFast:
    """Another vocabulary: the characters reversed, ``"<s>"``, then a few other merges (101 ids)."""
    vocab = {**{c: i for i, c in enumerate(reversed(CHARS))}, "<s>": len(CHARS)}
    vocab.update({a + b: len(CHARS) + 1 + i for i, (a, b) in enumerate(DRAFTER_MERGES)})
    return bpe_tokenizer(vocab, DRAFTER_MERGES)


def random_prompts(n: int, vocab: int, seed: int, length: tuple[int, int] = (6, 16)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(1, vocab, (1, int(torch.randint(length[0], length[1] + 1, (1,), generator=g))), generator=g)
        for _ in range(n)
    ]


def greedy(model, prompt: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    return model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=max_new_tokens, **kwargs
    )


def train_head(target, sizes: dict, device: torch.device) -> FeatureHead:
    """An EAGLE-3-style head fitted briefly (float32) to the target's own greedy answers, so that it drafts tokens the
    target keeps and the call's cache rollbacks are exercised: for position ``j`` it learns the target's choice after
    ``j + 1`` from the feature at ``j`` and the token at ``j + 1``."""
    layers = sizes["layers"]
    layer_ids = tuple(sorted({1, layers // 2, layers}))
    prompt = torch.cat(random_prompts(32, sizes["vocab"], seed=11, length=(4, 4))).to(device)
    seqs = greedy(target, prompt, 24)
    with torch.no_grad(), FeatureRecorder(target, layer_ids) as recorder:
        choices = target(seqs).logits.argmax(-1)
    features = recorder.features()
    torch.manual_seed(0)
    head = FeatureHead(FeatureHeadConfig.for_target(target, layer_ids=layer_ids), target.get_input_embeddings())
    optimizer = torch.optim.Adam(head.parameters(), lr=5e-3)
    for _ in range(sizes["head_steps"]):
        logits, _ = head(head.fuse(features[:, :-1]), seqs[:, 1:], head.new_cache())
        loss = F.cross_entropy(logits.flatten(0, 1).float(), choices[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval().requires_grad_(False)


def build_models(sizes: dict, device: torch.device) -> dict:
    """Every model of the run in float32 on `device`."""
    vocab, hidden, small = sizes["vocab"], sizes["hidden"], sizes["drafter_layers"]
    target = llama(0, sizes["layers"], hidden, vocab).to(device)
    built = {
        "target": target,
        "assistant": llama(1, small, hidden, vocab).to(device),
        "bridge": llama(6, small, hidden, len(drafter_tokenizer())).to(device),
        "head": train_head(target, sizes, device),
        "lora": None,
    }
    if importlib.util.find_spec("peft") is not None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        )
        torch.manual_seed(5)
        peft_model = get_peft_model(llama(5, small, hidden, vocab), config, adapter_name="code")
        peft_model.add_adapter("math", config)
        built["lora"] = peft_model.eval().to(device)
    return built


def in_dtype(built: dict, dtype: torch.dtype) -> dict:
    """Copies of every model in `dtype`; the head is rebuilt on the cast target's embedding (which it shares)."""
    out = {name: None if m is None else copy.deepcopy(m).to(dtype) for name, m in built.items() if name != "head"}
    head = FeatureHead(built["head"].config, out["target"].get_input_embeddings())
    head.load_state_dict(built["head"].state_dict())
    out["head"] = head.eval().requires_grad_(False)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# one pool per kind
# ---------------------------------------------------------------------------------------------------------------------
def _lora(m: dict, sizes: dict) -> list:
    if m["lora"] is None:
        raise _Skip("peft is not installed (`pip install peft`)")
    return LoraDrafter.from_peft_model(m["lora"])


def _corpus(m: dict, sizes: dict) -> list:
    """A corpus of the target's own answers to other prompts: it matches and drafts."""
    target = m["target"]
    prompts = [p.to(target.device) for p in random_prompts(6, sizes["vocab"], seed=7)]
    return [CorpusDrafter.from_sequences([greedy(target, p, 24)[0, p.shape[1] :].tolist() for p in prompts])]


def _recycling(models: dict, sizes: dict) -> list:
    """A token recycling table warmed on the target's own answers to other prompts, so that it drafts at once."""
    target = models["target"]
    prompts = [p.to(target.device) for p in random_prompts(3, sizes["vocab"], seed=11)]
    drafter = TokenRecyclingDrafter()
    drafter.warm_start(target, [greedy(target, p, 24)[0].tolist() for p in prompts])
    return [drafter]


class _Skip(Exception):
    """A kind this run cannot build; the message is the reason, reported in its row."""


#: kind -> pool of that kind, from the models of one dtype. A kind registered later has no builder: its row is MISSING.
BUILDERS = {
    "assistant_model": lambda m, s: [ModelDrafter(m["assistant"], name="small")],
    "corpus": _corpus,
    "early_exit": lambda m, s: [EarlyExitDrafter(m["target"], num_layers=max(1, s["layers"] // 3))],
    "feature_head": lambda m, s: [FeatureHeadDrafter(m["head"])],
    "lora": _lora,
    "other_tokenizer": lambda m, s: [
        TokenizerBridgeDrafter(
            m["bridge"], drafter_tokenizer(), target_tokenizer=target_tokenizer(s["vocab"]), name="other_tok"
        )
    ],
    "prompt_lookup": lambda m, s: [PromptLookupDrafter()],
    "token_recycling": _recycling,
}


# ---------------------------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn, reps: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def plain_step_seconds(target, context: int, reps: int) -> float:
    """One target step (one token, KV cache) after a `context`-token prefill: median seconds."""
    device = target.device
    prompt = random_prompts(1, target.config.vocab_size, seed=3, length=(context, context))[0].to(device)
    cache = DynamicCache(config=target.config)
    target(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    token = prompt[:, -1:]

    def step():
        target(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-1)  # back to the prefill

    return _median_seconds(step, reps, device)


@torch.no_grad()
def head_draft_seconds(target, head: FeatureHead, context: int, tokens: int, reps: int) -> list[float]:
    """The head drafting ``n = 1..tokens`` tokens after one new target feature (its cache holding `context - 1`
    entries, as in a round of a call): median seconds for each ``n``."""
    device = target.device
    prompt = random_prompts(1, target.config.vocab_size, seed=4, length=(context + 1, context + 1))[0].to(device)
    with FeatureRecorder(target, head.config.layer_ids) as recorder:
        target(prompt)
    features, next_ids = recorder.features()[:, :-1], prompt[:, 1:]
    cache = head.new_cache()
    head.draft(features[:, :-1], next_ids[:, :-1], 1, cache=cache)
    start = cache.committed
    return [
        _median_seconds(
            lambda n=n: head.draft(features[:, -1:], next_ids[:, -1:], n, cache=cache, start=start), reps, device
        )
        for n in range(1, tokens + 1)
    ]


def synchronizing_clock(device: torch.device):
    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def per_round_costs(stats: list, step: float) -> dict:
    """Each part's seconds per round over `stats` (`MetaSDStats`), as multiples of a plain step."""
    rounds = sum(s.rounds for s in stats) or 1
    seconds = {
        "wall": sum(s.wall_seconds for s in stats),
        "draft": sum(s.draft_seconds + s.prefill_seconds for s in stats),
        "verify": sum(s.verify_seconds for s in stats),
        "policy": sum(s.policy_seconds for s in stats),
        "reward": sum(s.reward_seconds for s in stats),
        "overhead": sum(s.overhead_seconds for s in stats),
    }
    return {part: seconds[part] / rounds / step for part in COST_PARTS}


# ---------------------------------------------------------------------------------------------------------------------
# the lossless check
# ---------------------------------------------------------------------------------------------------------------------
def check_pool(target, pool: list, prompts: list, references: list, hf_same: list[bool], max_new: int, **kwargs):
    """MetaSD greedy over `pool` on every prompt: (verdict, prompts that differ, the timed calls' stats, their mean
    accepted and drafted tokens per round)."""
    hf_metasd.clear_reward_memory()  # no row learns from another row's calls
    differ, stats = [], []
    for i, (prompt, reference) in enumerate(zip(prompts, references)):
        out = greedy(
            target,
            prompt,
            max_new,
            custom_generate=hf_metasd.generate,
            assistant_models=pool,
            return_dict_in_generate=True,
            **kwargs,
        )
        if not torch.equal(out.sequences, reference):
            differ.append(i)
        stats.append(out.metasd)
    if not differ:
        verdict = "PASS"
    elif all(not hf_same[i] for i in differ):
        verdict = "SHARED"
    else:
        verdict = "FAIL"
    timed = stats[1:] if len(stats) > 1 else stats
    rounds = sum(s.rounds for s in timed) or 1
    return (
        verdict,
        differ,
        timed,
        (sum(map(sum, (s.accepted for s in timed))) / rounds, sum(map(sum, (s.drafted for s in timed))) / rounds),
    )


def run_dtype(built: dict, dtype: torch.dtype, sizes: dict, kinds: list[str]) -> tuple[list[dict], dict]:
    """Every kind's row, the mixed pool's rows, and the timings of one dtype."""
    models = in_dtype(built, dtype)
    target, device, max_new = models["target"], models["target"].device, sizes["max_new_tokens"]
    prompts = [p.to(device) for p in random_prompts(sizes["prompts"], sizes["vocab"], seed=1234)]
    references = [greedy(target, p, max_new) for p in prompts]
    hf_outputs = [greedy(target, p, max_new, assistant_model=models["assistant"]) for p in prompts]
    hf_same = [torch.equal(h, r) for h, r in zip(hf_outputs, references)]
    step = plain_step_seconds(target, sizes["context"], sizes["reps"])
    head = head_draft_seconds(target, models["head"], sizes["context"], sizes["head_tokens"], sizes["reps"])
    timing = {"plain_step_ms": 1000 * step, "head_draft_steps": [s / step for s in head]}
    name = str(dtype).removeprefix("torch.")
    transformers_same = f"{sum(hf_same)}/{len(hf_same)}"
    rows, pools = [], {}
    for kind in kinds:
        row = {"kind": kind, "dtype": name, "transformers_same": transformers_same, "plain_step_ms": 1000 * step}
        if kind not in BUILDERS:
            rows.append({**row, "lossless": "MISSING", "reason": "no builder in gpu_check.BUILDERS"})
            continue
        try:
            pools[kind] = BUILDERS[kind](models, sizes)
        except _Skip as reason:
            rows.append({**row, "lossless": "SKIPPED", "reason": str(reason)})
            continue
        fixed = {"meta_policy": "fixed", "meta_policy_kwargs": {"arm": 0}}
        rows.append({**row, **_result(target, pools[kind], prompts, references, hf_same, max_new, step, **fixed)})
        if kind == "feature_head":
            rows[-1]["head_draft_steps"] = timing["head_draft_steps"]
    mixed = [d for pool in pools.values() for d in pool]
    for policy, kwargs in (("round_robin", {"meta_policy": "round_robin"}), ("default", {})):
        result = _result(target, mixed, prompts, references, hf_same, max_new, step, **kwargs)
        row = {"kind": f"mixed/{policy}", "dtype": name, "transformers_same": transformers_same}
        rows.append({**row, "plain_step_ms": 1000 * step, **result})
    return rows, timing


def _result(target, pool, prompts, references, hf_same, max_new, step, **kwargs) -> dict:
    verdict, differ, stats, (accepted, drafted) = check_pool(
        target, pool, prompts, references, hf_same, max_new, **kwargs
    )
    return {
        "lossless": verdict,
        "differ": differ,
        "rounds": sum(s.rounds for s in stats),
        "accepted_per_round": accepted,
        "drafted_per_round": drafted,
        "per_round_steps": per_round_costs(stats, step),
    }


# ---------------------------------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    """One markdown table: a row per (kind, dtype)."""
    head = ["kind", "dtype", "lossless", "transformers = plain", "step ms", "accepted/drafted per round"]
    head += [f"{part}/round" for part in COST_PARTS] + ["head drafts 1..N"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        costs = row.get("per_round_steps", {})
        lossless = row["lossless"] + (f" ({row['reason']})" if "reason" in row else "")
        if row.get("differ"):
            lossless += f" (prompts {row['differ']})"
        cells = [row["kind"], row["dtype"], lossless, row["transformers_same"], _f(row.get("plain_step_ms"), 3)]
        drafts = f"{_f(row.get('accepted_per_round'), 2)}/{_f(row.get('drafted_per_round'), 2)}" if costs else ""
        cells += [drafts] + [_f(costs.get(part), 3) for part in COST_PARTS]
        cells.append(" ".join(f"{x:.2f}" for x in row.get("head_draft_steps", [])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _f(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few tokens (seconds on a CPU)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON record")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("`--device` must name an available device, but is cuda and torch sees no GPU. Pass --device cpu.")
    device = torch.device(args.device)
    sizes = SIZES["quick" if args.quick else "full"]
    kinds = sorted(DRAFTER_KINDS)
    built = build_models(sizes, device)
    clock = hf_metasd.stats.CLOCK
    if device.type == "cuda":
        hf_metasd.stats.CLOCK = synchronizing_clock(device)
    try:
        rows, timings = [], {}
        for name in args.dtypes:
            dtype_rows, timings[name] = run_dtype(built, getattr(torch, name), sizes, kinds)
            rows += dtype_rows
    finally:
        hf_metasd.stats.CLOCK = clock
    print(table(rows))
    print(
        "\nCosts are multiples of one plain target step (step ms); the first prompt of each row is a warm-up. "
        "`transformers = plain`: prompts on which transformers' `assistant_model=` gives plain greedy's tokens."
    )
    record = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "hf_metasd": hf_metasd.__version__,
        "sizes": sizes,
        "timings": timings,
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=2, sort_keys=True))
    failed = [f"{r['kind']}/{r['dtype']}" for r in rows if r["lossless"] in ("FAIL", "MISSING")]
    if failed:
        print(f"lossless check failed (transformers' own assisted decoding matched plain there): {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
