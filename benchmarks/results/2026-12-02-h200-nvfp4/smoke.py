import time, torch
from flamia.workload import as_attention, make_packed_inputs, training_call
for d, lens in ((128, (1000, 333, 1, 77)), (64, (5, 1, 9))):
    t = time.time()
    i = make_packed_inputs(lens, heads_q=8, heads_kv=2, head_dim=d, dtype=torch.bfloat16, device="cuda")
    got = training_call(as_attention("nvfp4", "triton"), i)
    torch.cuda.synchronize()
    want = training_call(as_attention("nvfp4", "reference"), i)
    errs = {n: round(((a.double() - want.by_name()[n].double()).norm() / want.by_name()[n].double().norm()).item(), 5)
            for n, a in got.by_name().items() if n != "LSE"}
    print("smoke nvfp4 d", d, lens, errs, f"{time.time() - t:.0f} s", flush=True)
