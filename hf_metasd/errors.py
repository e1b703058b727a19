"""Exceptions raised by hf_metasd.

Every exception refines a built-in (``ValueError``, ``TypeError``, ``IndexError``), as huggingface_hub's errors do, so
code that already catches the built-in keeps working. Messages follow transformers' shape: "`arg` must X, but is V.
Do Y."
"""

from __future__ import annotations

__all__ = [
    "BenchmarkConfigError",
    "BenchmarkFileNotFoundError",
    "CustomGenerateRepoError",
    "DrafterCompatibilityError",
    "DuplicateDrafterKindError",
    "InvalidPoolError",
    "InvalidPoolTypeError",
    "MetaSDConfigError",
    "MetaSDDrafterError",
    "MetaSDTypeError",
    "PolicyArmError",
    "UnknownPolicyError",
    "UnknownPolicySettingError",
    "UnknownRewardError",
]


class MetaSDConfigError(ValueError):
    """A `generate` argument that MetaSD cannot serve (empty pool, batch size, draft length, ...)."""


class MetaSDTypeError(MetaSDConfigError, TypeError):
    """A MetaSD setting of the wrong type (``meta_replay="yes"``, ``meta_priors=[...]``)."""


class MetaSDDrafterError(MetaSDConfigError):
    """A drafter of the pool returned a draft MetaSD cannot verify: token ids outside the target's vocabulary, or
    logits that are no distribution (NaN). Raised before the target sees the draft; the message names the drafter."""


class UnknownPolicyError(MetaSDConfigError, KeyError):
    """`meta_policy` names no registered policy."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class UnknownPolicySettingError(MetaSDConfigError, TypeError):
    """`meta_policy_kwargs` names a setting the policy does not have.

    Also a `TypeError`, which is what the policy's constructor raised for an unknown keyword before this check.
    """


class UnknownRewardError(MetaSDConfigError, KeyError):
    """`meta_reward` names no known reward."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DrafterCompatibilityError(MetaSDConfigError):
    """A drafter cannot draft for this target (vocabulary size, tokenizer, device, architecture)."""


class PolicyArmError(IndexError):
    """A policy selected an arm that is not in the pool."""


class InvalidPoolError(ValueError):
    """A drafter pool (or its `config.json`) is invalid: it is never saved, pushed or loaded."""


class InvalidPoolTypeError(InvalidPoolError, TypeError):
    """A pool's field or argument has the wrong type (a `str` where a dict belongs, a policy instance to be saved)."""


class DuplicateDrafterKindError(ValueError):
    """`register_drafter_kind` was given a kind name that another class already holds."""


class CustomGenerateRepoError(ValueError):
    """The ``custom_generate`` repository cannot be written: the folder is a file or holds files (without
    `overwrite`), or its requirements cannot be written in the form transformers checks."""


class BenchmarkConfigError(ValueError):
    """An option of ``hf-metasd bench`` / ``demo`` (`run_benchmark`, `run_demo`), or its prompts file, that the
    benchmark cannot run with: refused before any model loads (the command then exits with status 2)."""


class BenchmarkFileNotFoundError(BenchmarkConfigError, FileNotFoundError):
    """A file the benchmark is given (``--prompts``) does not exist. Also a `FileNotFoundError`."""
