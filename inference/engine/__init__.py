"""The inference engine (after nano-vllm): torch-free scheduler and block manager, one model runner for the device.

`LLMEngine` and `StepOutput` load lazily, so that code which only validates requests (Config, SamplingParams) and
the torch-free modules import without torch.
"""
from inference.engine.config import Config
from inference.engine.sequence import SamplingParams, Sequence, SequenceStatus

__all__ = ["Config", "LLMEngine", "SamplingParams", "Sequence", "SequenceStatus", "StepOutput"]


def __getattr__(name: str):
    if name in ("LLMEngine", "StepOutput"):
        from inference.engine import llm_engine

        return getattr(llm_engine, name)
    raise AttributeError(f"module 'inference.engine' has no attribute {name!r}")
