"""Why the demo's eager training call (5.9 ms on logu11-16k) is slower than a plain eager loop
(3.7 ms): speed() alone in a fresh process, with allocator and sync counters, then under
torch.profiler (CPU self time, top ops)."""
import sys, time, torch
from torch.profiler import ProfilerActivity, profile
from flamia import demo
mode = sys.argv[1]
if mode == "full":
    demo.accuracy_and_verdicts(torch.device("cuda"))
torch.cuda.synchronize()
s0 = torch.cuda.memory_stats()
demo.speed()
s1 = torch.cuda.memory_stats()
for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams"):
    print(k, s1.get(k, 0) - s0.get(k, 0))
if mode == "profile":
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        demo.speed(out=lambda *_: None)
    ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    for e in ev:
        print(f"{e.key[:60]:60s} {e.count:8d} {e.self_cpu_time_total/1e3:10.2f} ms")
