"""flamia: low-precision (MXFP8 / NVFP4) FlashAttention for training on packed documents."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("flamia")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

from .api import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from .recipes import RECIPES, Recipe  # noqa: E402
from .reference.exact import exact_attention  # noqa: E402

__all__ = ["flash_attn_varlen_func", "flash_attn_func", "Recipe", "RECIPES", "exact_attention", "__version__"]
