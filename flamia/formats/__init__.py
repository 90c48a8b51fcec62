"""Number formats and quantizers: pure torch, CPU and GPU, the numerics reference."""
from .e2m1 import (E2M1_MAX, E2M1_VALUES, e2m1_codes, e2m1_decode, pack_e2m1, round_to_e2m1,
                   round_to_e2m1_stochastic, unpack_e2m1)
from .e4m3 import E4M3_MAX, E4M3_MIN_SUBNORMAL, LOG2_E4M3_MAX, assert_in_range, round_to_e4m3, to_e4m3
from .hadamard import HADAMARD_DIMS, hadamard_matrix, hadamard_transform
from .scales import EXP_MAX, EXP_MIN, exp2i, scale_exponent
from .token_block import dequantize_token_blocks, quantize_padded, quantize_token_blocks

__all__ = [
    "E2M1_MAX", "E2M1_VALUES", "e2m1_codes", "e2m1_decode", "pack_e2m1", "round_to_e2m1",
    "round_to_e2m1_stochastic", "unpack_e2m1",
    "E4M3_MAX", "E4M3_MIN_SUBNORMAL", "LOG2_E4M3_MAX", "assert_in_range", "round_to_e4m3", "to_e4m3",
    "HADAMARD_DIMS", "hadamard_matrix", "hadamard_transform",
    "EXP_MAX", "EXP_MIN", "exp2i", "scale_exponent",
    "dequantize_token_blocks", "quantize_padded", "quantize_token_blocks",
]
