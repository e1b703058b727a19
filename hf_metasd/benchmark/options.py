"""What ``hf-metasd bench`` and ``demo`` (`hf_metasd.benchmark.run`) refuse before any model loads.

A flag that would run something else than it says (``--num-assistant-tokens 0`` ran with the pool's length) or
nothing at all (``--per-task 0``), or that would fail only after the models loaded or after the whole run
(``--max-new-tokens 0``, ``--threads 0``, a ``--pool`` folder that does not exist, an ``--out`` path that is a file:
the results were lost) is a `BenchmarkConfigError` (`InvalidPoolError` for the pool), which the command reports in
one line with exit status 2 (`hf_metasd.cli`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .._validation import check_int
from ..drafters.spec import MAX_NUM_ASSISTANT_TOKENS, is_local_reference
from ..errors import BenchmarkConfigError, InvalidPoolError

__all__ = ["check_options"]


def check_options(
    *,
    threads: int = 2,
    pool: str | None = None,
    max_new_tokens: int | None = None,
    out: str | Path | None = None,
    per_task: int | None = None,
    num_assistant_tokens: int | None = None,
    untrained: int = 0,
) -> None:
    """Refuse the options of `run_benchmark` that it cannot run as asked (module docstring), before any model loads;
    `run_demo` checks its `threads` and `pool` here.

    Raises:
        BenchmarkConfigError: an option out of its range, or `out` a file (or inside one).
        InvalidPoolError: `pool` a local path that is no folder (a Hub repo id is checked when the pool loads).

    Example:
        >>> check_options(threads=2, per_task=3, max_new_tokens=None, num_assistant_tokens=4)
        >>> check_options(per_task=0)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.BenchmarkConfigError: `per_task` must be an int >= 1 or None (3 prompts per task; 1 with `quick`), but is 0. Pass e.g. `--per-task 3`, or leave it out.
    """
    check_int("threads", threads, low=1, hint="Pass e.g. `--threads 2`.", error=BenchmarkConfigError)
    check_int(
        "untrained", untrained, low=0, hint="Pass e.g. `--untrained 2`, or 0 for the pool.", error=BenchmarkConfigError
    )
    optional = {
        "max_new_tokens": (max_new_tokens, "64; 48 with `quick`", "`--max-new-tokens 64`"),
        "per_task": (per_task, "3 prompts per task; 1 with `quick`", "`--per-task 3`"),
    }
    for name, (value, default, example) in optional.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise BenchmarkConfigError(
                f"`{name}` must be an int >= 1 or None ({default}), but is {value!r}. Pass e.g. {example}, or leave "
                "it out."
            )
    n = num_assistant_tokens
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NUM_ASSISTANT_TOKENS):
        raise BenchmarkConfigError(
            f"`num_assistant_tokens` must be an int in [1, {MAX_NUM_ASSISTANT_TOKENS}] or None (the pool's), but is "
            f"{n!r}. Pass e.g. `--num-assistant-tokens 3`, or leave it out for the pool's draft length."
        )
    if pool is not None and is_local_reference(str(pool)) and not os.path.isdir(os.path.expanduser(str(pool))):
        what = "is a file" if os.path.exists(os.path.expanduser(str(pool))) else "does not exist"
        raise InvalidPoolError(
            f"`pool` must be a pool folder or a Hub repo id, but {str(pool)!r} {what}. Pass a pool folder "
            "(`DrafterPool.save_pretrained`) or a Hub repo id with `--pool`, or leave it out for the embedded pool."
        )
    if out is not None:
        folder = Path(out).absolute()
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise BenchmarkConfigError(
                f"`out` must be a folder to write the results in, but {str(blocking)!r} is a file. Pass another "
                "folder with `--out`, or move the file away."
            )
