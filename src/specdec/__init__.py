"""specdec: lossless speculative decoding for LLMs."""

from specdec.api import LLM, CompletionOutput, RequestOutput
from specdec.sampling_params import SamplingParams
from specdec.speculative_config import SpeculativeConfig

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "SpeculativeConfig"]
__version__ = "0.1.0"
