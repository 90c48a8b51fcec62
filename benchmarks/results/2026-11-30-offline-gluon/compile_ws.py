import os, sys
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import ws_probe
sig = {"p_q": "*fp8e4nv", "p_k": "*fp8e4nv", "p_vt": "*fp8e4nv", "p_o": "*fp32", "n_tiles": "i32",
       "D": "constexpr", "BM": "constexpr", "BN": "constexpr", "STAGES": "constexpr"}
attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3)}
src = GluonASTSource(ws_probe.ws_probe, sig, {"D": 128, "BM": 64, "BN": 128, "STAGES": 3}, attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
open("/tmp/ws.cubin", "wb").write(k.asm["cubin"]); open("/tmp/ws.ptx", "w").write(k.asm["ptx"]); print("compiled")
