"""flamia: low-precision (MXFP8 / NVFP4) FlashAttention for training on packed documents."""
from .api import flash_attn_func, flash_attn_varlen_func
from .recipes import RECIPES, Recipe
from .reference.exact import exact_attention

__all__ = ["flash_attn_varlen_func", "flash_attn_func", "Recipe", "RECIPES", "exact_attention"]
