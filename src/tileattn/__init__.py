"""tileattn: FlashAttention kernels written by hand in CUDA C++, compiled at run time by NVRTC."""

from . import (
    backward,  # noqa: F401  (registers tileattn::fwd's autograd formula)
    fp8,  # noqa: F401  (FP8 inputs: fp8.quantize_e4m3 makes them and their descale factors)
)
from .api import backward_head_dims, flash_attn_func, scaled_dot_product_attention
from .serving import flash_attn_varlen_func, flash_attn_with_kvcache
from .versions import BWD_VERSIONS, VERSIONS

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
    "backward_head_dims",
    "VERSIONS",
    "BWD_VERSIONS",
]
__version__ = "0.1.0"
