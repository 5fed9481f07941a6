"""tpserve: a tensor-parallel serving engine for GLM-5.3-Flash (glm5_next)."""

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name):  # lazy: `import tpserve` stays cheap for the CLI and workers
    if name == "LLM":
        from tpserve.llm import LLM
        return LLM
    if name in ("SamplingParams",):
        from tpserve.sampling_params import SamplingParams
        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from tpserve.engine import outputs
        return getattr(outputs, name)
    raise AttributeError(name)
