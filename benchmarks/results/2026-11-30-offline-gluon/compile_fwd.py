import sys
sys.path[:0] = [__import__("os").path.dirname(__file__)]
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import fwd_probe
sig = {"p_q": "*fp8e4nv", "p_k": "*fp8e4nv", "p_vt": "*fp8e4nv", "p_o": "*fp32", "n_tiles": "i32",
       "D": "constexpr", "BM": "constexpr", "BN": "constexpr"}
attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3)}
src = GluonASTSource(fwd_probe.fwd_probe, sig, {"D": 128, "BM": 64, "BN": 128}, attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
open("/tmp/fwd.cubin", "wb").write(k.asm["cubin"]); open("/tmp/fwd.ttgir", "w").write(k.asm["ttgir"]); print("compiled")
