"""`DrafterPool`: the ordered drafters plus the defaults of a MetaSD call; saved, loaded and pushed as a Hub artefact.

**Why not huggingface_hub's `ModelHubMixin`.** We follow its shape (a private pair `_save_pretrained` /
`_from_pretrained` behind public `save_pretrained` / `from_pretrained` / `push_to_hub`; a push is one commit holding
`config.json`, the `README.md` model card and the weights) but do not inherit it: the mixin's public
`save_pretrained` has no way to forward our ``store_weights=`` to `_save_pretrained` and creates the folder before
`_save_pretrained` runs (an invalid pool must write nothing), its `push_to_hub` saves again (planning the pool twice),
and its `from_pretrained` reads `config.json` to rebuild ``__init__`` arguments, which for a pool are drafters built
for the required ``target=``. Inheriting it would have meant re-implementing its whole public trio anyway.

**One plan per save or push.** `_plan` runs every kind's `Drafter.to_spec` once, validates the resulting config and
returns the writes it scheduled; `save_pretrained` and `push_to_hub` then only execute that plan (into the folder,
or into a temporary folder that one `upload_folder` commit pushes). An invalid pool raises before anything is written
or any Hub call is made.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import HfApi, ModelCard, snapshot_download
from huggingface_hub.errors import HFValidationError

from ..drafters import DRAFTER_KINDS, Drafter, DrafterSpec, as_drafters, tokenizer_fingerprint
from ..drafters.load import LoadContext
from ..drafters.save import SaveContext
from ..drafters.spec import is_local_reference
from ..errors import InvalidPoolError, InvalidPoolTypeError
from ..settings import DEFAULTS
from ..untrusted import check_links
from .card import pool_card
from .config import CONFIG_NAME, DrafterPoolConfig, validate_defaults, validate_priors

__all__ = ["MODEL_CARD_NAME", "DrafterPool"]

MODEL_CARD_NAME = "README.md"
_Writes = list[Callable[[Path], None]]


class DrafterPool:
    """An ordered pool of drafters with the defaults of a MetaSD call; savable to a folder or the Hub.

    Args:
        drafters: what ``assistant_models=`` accepts: `Drafter` objects, transformers causal LMs, peft models (one
            arm per adapter).
        target: the target model (enables checks and embedding sharing on save) or its Hub id.
        policy, policy_kwargs: registered policy name and settings used by default.
        reward: reward name used by default.
        num_assistant_tokens: tokens drafted per round by default.
        tokenizer: the tokenizer the drafters share with the target (optional): its fingerprint
            (`hf_metasd.drafters.tokenizer_fingerprint`) is saved, and loading with another tokenizer is refused.
        priors: prior mean reward per drafter name, in ``[0, 1]`` under `reward` (``"no_draft"``: the no-draft arm
            of a cost-aware reward; repeated names are told apart as ``name#k``, as generate reports them).
        prior_weight: pseudo-observations each prior counts as (``None``: the policy's default).

    Policy, reward and draft length default to `hf_metasd.settings.DEFAULTS`. Pass the pool itself to
    generation: ``generate(..., custom_generate=hf_metasd.generate, assistant_models=pool)`` (see `generate_kwargs`).

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> pool = DrafterPool([PromptLookupDrafter()], target="HuggingFaceTB/SmolLM2-135M-Instruct", policy="ucb")
        >>> pool.generate_kwargs()["meta_policy"], pool.reward, [d.name for d in pool.drafters]
        ('ucb', 'speed', ['prompt_lookup'])
    """

    def __init__(
        self,
        drafters: Sequence[Any],
        *,
        target: Any = None,
        policy: str = DEFAULTS["meta_policy"],
        policy_kwargs: dict[str, Any] | None = DEFAULTS["meta_policy_kwargs"],
        reward: str = DEFAULTS["meta_reward"],
        num_assistant_tokens: int = DEFAULTS["num_assistant_tokens"],
        tokenizer: Any = None,
        priors: dict[str, float] | None = None,
        prior_weight: float | None = None,
    ) -> None:
        empty = isinstance(drafters, Sequence) and not isinstance(drafters, (str, bytes)) and len(drafters) == 0
        self.drafters: list[Drafter] = [] if empty else as_drafters(drafters)  # `validate` refuses an empty pool
        self.target = target if isinstance(target, torch.nn.Module) else None
        self.target_id: str | None = (
            target if isinstance(target, str) else (getattr(target, "name_or_path", None) or None)
        )
        self.policy = policy
        self.policy_kwargs = dict(policy_kwargs or {})
        self.reward = reward
        self.num_assistant_tokens = num_assistant_tokens
        self.tokenizer_hash: str | None = None if tokenizer is None else tokenizer_fingerprint(tokenizer)
        self.priors = dict(priors) if isinstance(priors, dict) else priors  # validated below
        self.prior_weight = prior_weight
        self.validate()

    # ------------------------------------------------------------------ generation
    def generate_kwargs(self) -> dict[str, Any]:
        """The pool's defaults for `hf_metasd.generate` (explicit arguments to generate take precedence).

        ``meta_priors`` / ``meta_prior_weight`` are ``None`` when the pool ships no priors.
        """
        return {
            "meta_policy": self.policy,
            "meta_policy_kwargs": dict(self.policy_kwargs),
            "meta_reward": self.reward,
            "num_assistant_tokens": self.num_assistant_tokens,
            "meta_priors": None if self.priors is None else dict(self.priors),
            "meta_prior_weight": self.prior_weight,
        }

    def validate(self) -> None:
        """Raise `InvalidPoolError` for an empty pool, bad defaults (policy, reward, draft length) or bad priors."""
        if not self.drafters:
            raise InvalidPoolError(
                "pool `drafters` must hold at least one drafter, but is empty. Add a drafter, e.g. "
                "`DrafterPool([PromptLookupDrafter()])`."
            )
        for i, drafter in enumerate(self.drafters):
            if not isinstance(drafter, Drafter):
                raise InvalidPoolTypeError(
                    f"pool `drafters[{i}]` must be a `Drafter`, but is {type(drafter).__name__}. Build the pool with "
                    "`DrafterPool([...])`, which wraps models and peft models."
                )
        validate_defaults(self.policy, self.policy_kwargs, self.reward, self.num_assistant_tokens)
        validate_priors(self.priors, self.prior_weight, [d.name for d in self.drafters], self.policy, self.reward)

    def __len__(self) -> int:
        return len(self.drafters)

    def __repr__(self) -> str:
        names = ", ".join(repr(d.name) for d in self.drafters)
        return f"DrafterPool([{names}], policy={self.policy!r}, reward={self.reward!r}, N={self.num_assistant_tokens})"

    # ------------------------------------------------------------------ the save plan (validation, no I/O)
    def to_config(self, *, store_weights: bool = False, tokenizer: Any = None) -> DrafterPoolConfig:
        """The `config.json` this pool saves as (validates; writes nothing)."""
        return self._plan(store_weights=store_weights, tokenizer=tokenizer)[0]

    def _plan(
        self, *, store_weights: bool, for_hub: bool = False, tokenizer: Any = None
    ) -> tuple[DrafterPoolConfig, _Writes]:
        """Everything a save writes: the config (validated) and the scheduled writes. No file is touched."""
        self.validate()
        ctx = SaveContext(self.drafters, target=self.target, store_weights=store_weights, for_hub=for_hub)
        specs: list[DrafterSpec] = []
        i = 0
        while i < len(self.drafters):
            drafter = self.drafters[i]
            ctx.position = i
            kind = drafter.kind
            if DRAFTER_KINDS.get(kind) is not type(drafter):
                raise InvalidPoolError(
                    f"{ctx.where(drafter)} must be of a registered kind to be saved, but its kind {kind!r} maps to "
                    f"{getattr(DRAFTER_KINDS.get(kind), '__name__', None)} in {sorted(DRAFTER_KINDS)}. Register "
                    f"`{type(drafter).__name__}` with `hf_metasd.drafters.register_drafter_kind`."
                )
            group, key = [drafter], drafter.spec_group()
            while (
                key is not None
                and i + len(group) < len(self.drafters)
                and type(self.drafters[i + len(group)]) is type(drafter)
                and self.drafters[i + len(group)].spec_group() == key
            ):
                group.append(self.drafters[i + len(group)])
            specs.append(type(drafter).to_spec(group, ctx))
            i += len(group)
        config = DrafterPoolConfig(
            drafters=specs,
            target=self.target_id,
            policy=self.policy,
            policy_kwargs=dict(self.policy_kwargs),
            reward=self.reward,
            num_assistant_tokens=self.num_assistant_tokens,
            tokenizer_hash=self.tokenizer_hash if tokenizer is None else tokenizer_fingerprint(tokenizer),
            priors=None if self.priors is None else dict(self.priors),
            prior_weight=self.prior_weight,
        )
        config.validate()
        return config, ctx.writes

    # ------------------------------------------------------------------ save / push
    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        *,
        store_weights: bool = False,
        tokenizer: Any = None,
        repo_id: str | None = None,
        push_to_hub: bool = False,
        model_card_kwargs: dict[str, Any] | None = None,
        **push_to_hub_kwargs: Any,
    ) -> Any:
        """Write `config.json`, the `README.md` model card (kept if the folder already has one, as huggingface_hub
        does) and any weights the pool stores. The pool is planned and validated once, first: an invalid pool
        writes nothing (and pushes nothing).

        Args:
            save_directory: the pool folder (created).
            store_weights: store assistant-model and LoRA drafters' weights in the folder instead of references (a
                reference to a local folder loads only when the caller allows it: `from_pretrained`'s `local_paths`).
            tokenizer: the drafters' (and target's) tokenizer: its fingerprint goes into `config.json` (default: the
                one the pool was built or loaded with, if any).
            repo_id, push_to_hub: also push the same plan (see `push_to_hub`; `repo_id` defaults to the folder name).
            model_card_kwargs: e.g. ``{"repo_id": ...}`` for the usage snippet.

        Returns:
            The push's commit info with `push_to_hub`, else ``None``.
        """
        hub = _hub_arguments(model_card_kwargs=model_card_kwargs, **push_to_hub_kwargs) if push_to_hub else None
        config, writes = self._plan(store_weights=store_weights, for_hub=push_to_hub, tokenizer=tokenizer)
        save_directory = Path(save_directory)
        card_kwargs = dict(model_card_kwargs or {})
        card_kwargs.setdefault("repo_id", repo_id)
        self._save_pretrained(save_directory, config=config, writes=writes, model_card_kwargs=card_kwargs)
        if hub is not None:
            return self._push(repo_id or save_directory.name, config, writes, hub)
        return None

    def _save_pretrained(
        self,
        save_directory: Path,
        *,
        config: DrafterPoolConfig,
        writes: _Writes,
        model_card_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Execute a plan into `save_directory`: the weights, `config.json`, and the card unless one is there."""
        save_directory.mkdir(parents=True, exist_ok=True)
        for write in writes:
            write(save_directory)
        config._write(save_directory)
        card_path = save_directory / MODEL_CARD_NAME
        if not card_path.exists():
            self.generate_model_card(config=config, **(model_card_kwargs or {})).save(card_path)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        store_weights: bool = False,
        tokenizer: Any = None,
        commit_message: str = "Upload MetaSD drafter pool",
        private: bool | None = None,
        token: str | None = None,
        branch: str | None = None,
        create_pr: bool | None = None,
        allow_patterns: list[str] | str | None = None,
        ignore_patterns: list[str] | str | None = None,
        delete_patterns: list[str] | str | None = None,
        model_card_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Push the pool to the Hub in **one** commit (`config.json`, `README.md`, stored weights).

        The pool is planned and validated first (nothing is created on the Hub for an invalid pool); references to
        local folders cannot be resolved from the Hub and are refused: push those drafters with `store_weights=True`.
        """
        config, writes = self._plan(store_weights=store_weights, for_hub=True, tokenizer=tokenizer)
        hub = {
            "commit_message": commit_message,
            "private": private,
            "token": token,
            "branch": branch,
            "create_pr": create_pr,
            "allow_patterns": allow_patterns,
            "ignore_patterns": ignore_patterns,
            "delete_patterns": delete_patterns,
            "model_card_kwargs": model_card_kwargs,
        }
        return self._push(repo_id, config, writes, hub)

    def _push(self, repo_id: str, config: DrafterPoolConfig, writes: _Writes, hub: dict[str, Any]) -> Any:
        """Execute a plan into a temporary folder and upload it as one commit; `hub` holds every Hub argument of
        `push_to_hub` (see `_hub_arguments`)."""
        api = HfApi(token=hub["token"])
        repo_id = api.create_repo(repo_id=repo_id, private=hub["private"], exist_ok=True).repo_id
        card_kwargs = dict(hub["model_card_kwargs"] or {})
        card_kwargs.setdefault("repo_id", repo_id)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "pool"
            self._save_pretrained(folder, config=config, writes=writes, model_card_kwargs=card_kwargs)
            return api.upload_folder(
                repo_id=repo_id,
                repo_type="model",
                folder_path=folder,
                commit_message=hub["commit_message"],
                revision=hub["branch"],
                create_pr=hub["create_pr"],
                allow_patterns=hub["allow_patterns"],
                ignore_patterns=hub["ignore_patterns"],
                delete_patterns=hub["delete_patterns"],
            )

    def generate_model_card(self, *args: Any, config: DrafterPoolConfig | None = None, **kwargs: Any) -> ModelCard:
        """A model card: ``library_name: hf_metasd``, ``base_model:`` the target, the drafter table, the defaults
        (the policy with its settings), the priors, a usage snippet (``repo_id=`` names the repo in it)."""
        return pool_card(config or self.to_config(), repo_id=kwargs.get("repo_id"))

    # ------------------------------------------------------------------ load
    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        target: Any,
        tokenizer: Any = None,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        local_paths: Mapping[str, str | os.PathLike] | None = None,
    ) -> DrafterPool:
        """Load a pool from a folder or a Hub repo and build every drafter for `target`.

        A pool is untrusted data (`hf_metasd.untrusted`): loading it runs no code (``trust_remote_code=False``
        everywhere; files that ask for code are refused), reads weights from safetensors only, checks every number
        of `config.json` against its documented range, and reads only the pool's own files: a drafter that
        references a local folder outside the pool is refused unless you map it with `local_paths`.

        Args:
            pretrained_model_name_or_path: a pool folder or a Hub repo id.
            target: the target model (early-exit drafters use its layers; shared embeddings are re-attached to it;
                every drafter is checked against its vocabulary).
            tokenizer: the target's tokenizer (optional): when the pool recorded a tokenizer fingerprint, they must
                match (checked before any drafter is built). Drafters with a tokenizer of their own need it to load
                (`LoadContext.tokenizer`), unless the pool stores a copy.
            revision, token, cache_dir, force_download, local_files_only: as in huggingface_hub; `token` is also used
                for the drafters the pool references.
            local_paths: your map from a path the pool's `config.json` records (a drafter's `path`, or a folder of
                its `params` such as an other-tokenizer drafter's ``tokenizer``), exactly as written there, to a local
                folder to read instead, e.g. ``{"/home/me/drafter": "/home/me/drafter"}`` to allow a reference to a
                local folder, or ``{"org/drafter": "./drafter-copy"}`` to use a local copy of a Hub drafter. A mapped
                folder is yours: it may lie outside the pool, and its tokenizer patterns are not checked (still no
                code runs). Each key must be a path the config records.

        Raises:
            InvalidPoolError: no or corrupt `config.json`, a missing or corrupt drafter file, a newer pool format, a
                number out of its range, a file that asks for code, a path or symbolic link leaving the pool, a
                tokenizer that fails or does not match its recorded fingerprint.
            DrafterCompatibilityError: a drafter's vocabulary, or the pool's tokenizer, is not the target's.
        """
        load = {"target": target, "tokenizer": tokenizer, "local_paths": local_paths}
        return cls._from_pretrained(
            model_id=str(pretrained_model_name_or_path),
            revision=revision,
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
            token=token,
            **load,
        )

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | os.PathLike | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        **load: Any,
    ) -> DrafterPool:
        """huggingface_hub's private half of `from_pretrained`: the folder (downloaded for a Hub id), its config, then
        `from_config` with `load` (``target``, ``tokenizer``, ``local_paths``)."""
        hub = {k: v for k, v in {"token": token, "cache_dir": cache_dir}.items() if v is not None}
        if os.path.isdir(model_id):
            root = Path(model_id)
        elif is_local_reference(model_id):
            raise InvalidPoolError(
                f"`pretrained_model_name_or_path` must be a pool folder or a Hub repo id, but {model_id!r} does not "
                "exist. Check the path."
            )
        else:
            try:
                root = Path(
                    snapshot_download(
                        model_id,
                        revision=revision,
                        force_download=force_download,
                        local_files_only=local_files_only,
                        **hub,
                    )
                )
            except HFValidationError as err:
                raise InvalidPoolError(
                    f"`pretrained_model_name_or_path` must be a pool folder or a Hub repo id, but {model_id!r} is "
                    "neither. Check the path or repo id."
                ) from err
        check_links(root)  # before any file is read, config.json included
        config = DrafterPoolConfig.from_json_file(root / CONFIG_NAME)
        return cls.from_config(config, root=root, token=token, cache_dir=cache_dir, **load)

    @classmethod
    def from_config(
        cls,
        config: DrafterPoolConfig,
        *,
        target: Any,
        root: str | os.PathLike | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        tokenizer: Any = None,
        local_paths: Mapping[str, str | os.PathLike] | None = None,
    ) -> DrafterPool:
        """Build the pool described by `config` for `target`; stored entries are read from the folder `root`;
        `tokenizer` and `local_paths` as in `from_pretrained` (the same untrusted-data rules apply)."""
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(
                f"`target` must be the target model (a transformers causal LM), but is {type(target).__name__}. "
                "Pass e.g. `target=AutoModelForCausalLM.from_pretrained(config.target)`."
            )
        config.validate()
        mapped = _local_paths(config, local_paths)
        config.check_tokenizer(tokenizer)
        if root is not None:
            check_links(root)
        hub = {k: v for k, v in {"token": token, "cache_dir": cache_dir}.items() if v is not None}
        ctx = LoadContext(
            None if root is None else Path(root),
            target=target,
            hub=hub,
            specs=config.drafters,
            tokenizer=tokenizer,
            local_paths=mapped,
        )
        drafters: list[Drafter] = []
        for i, spec in enumerate(config.drafters):
            ctx.position = i
            built = DRAFTER_KINDS[spec.kind].from_spec(spec, ctx)
            for drafter in built:
                drafter.check_compatible(target)
            drafters.extend(built)
        pool = cls(
            drafters,
            target=target,
            policy=config.policy,
            policy_kwargs=config.policy_kwargs,
            reward=config.reward,
            num_assistant_tokens=config.num_assistant_tokens,
            priors=config.priors,
            prior_weight=config.prior_weight,
        )
        pool.tokenizer_hash = config.tokenizer_hash
        pool.target_id = config.target or pool.target_id
        return pool


def _hub_arguments(**kwargs: Any) -> dict[str, Any]:
    """Every Hub argument of `push_to_hub` (all but `repo_id`, `store_weights`, `tokenizer`): the ones given, the rest
    at its defaults. What `save_pretrained(push_to_hub=True, ...)` forwards is checked here, before any Hub call.
    `push_to_hub`'s signature is the one place these arguments and their defaults are written."""
    parameters = inspect.signature(DrafterPool.push_to_hub).parameters
    names = [name for name in parameters if name not in _PUSH_PLAN_ARGUMENTS]
    unknown = [key for key in kwargs if key not in names]
    if unknown:
        raise TypeError(
            f"`push_to_hub_kwargs` must be Hub arguments of `push_to_hub` {names}, but has unknown {unknown[0]!r}. "
            "See `help(DrafterPool.push_to_hub)`."
        )
    return {name: kwargs.get(name, parameters[name].default) for name in names}


#: `push_to_hub`'s arguments that are not Hub arguments (they shape the plan, or name the repo).
_PUSH_PLAN_ARGUMENTS = ("self", "repo_id", "store_weights", "tokenizer")


def _local_paths(config: DrafterPoolConfig, local_paths: Any) -> dict[str, Path]:
    """`local_paths` as ``{recorded path: Path}``; each key must be a path `config` records (an entry's `path`, or a
    string of its `params`), so that a typo is not silently ignored."""
    if local_paths is None:
        return {}
    if not isinstance(local_paths, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (str, os.PathLike)) for k, v in local_paths.items()
    ):
        raise TypeError(
            f"`local_paths` must map paths of the pool's config.json (str) to local folders (str or path), but is "
            f"{local_paths!r}. Pass e.g. `local_paths={{'/home/me/drafter': '/home/me/drafter'}}`."
        )
    recorded = {spec.path for spec in config.drafters if spec.path is not None}
    recorded |= {v for spec in config.drafters for v in spec.params.values() if isinstance(v, str)}
    for key in local_paths:
        if key not in recorded:
            raise InvalidPoolError(
                f"`local_paths` must map paths the pool's config.json records ({sorted(recorded)}), but maps {key!r}. "
                "Write the key exactly as config.json does."
            )
    return {key: Path(value).expanduser() for key, value in local_paths.items()}
