"""Compile every Triton (and Gluon) launch of one training call for Hopper (sm_90a) on a machine
without a GPU, and read its SASS: registers, spills, shared memory, FP8 and BF16 wgmma (QGMMA, HGMMA) counts, and the instruction mix
of each kernel's step loop. Device time is scarce; instruction counts are not.

    PYTHONPATH=. python3 benchmarks/sass_offline.py [--workload eq8x8k] [--recipe mxfp8] [--bf16-scores] [--options JSON]
                                                    [--kernels REGEX] [--forward-only] [--out FILE]
                                                    [--sass-dir DIR]

How: a first process runs the training call on the CPU under TRITON_INTERPRET=1 with every
kernel launch intercepted and skipped, recording each launch's arguments (tensors of the
workload's real shapes, ints, floats, launch options). A second process, without the
interpreter, compiles each recorded kernel with ``triton.compile`` for
GPUTarget("cuda", 90, 32), specialised as a launch would be (pointers and ints divisible by
16 marked so, ints equal to 1 made constants, save the ints in a kernel's do_not_specialize;
INTERPRET=False; Gluon kernels, which have no interpreter, are recorded where the GPU would
launch them), and disassembles the cubin with the cuobjdump that ships with Triton. The SASS
is that of the installed Triton: the kernels are tuned with Triton 3.6, so install that one
beside this checkout for faithful numbers (``pip install --target DIR triton==3.6.0`` and put
DIR first on PYTHONPATH).
"""
import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# This checkout's flamia for both processes, also where another one is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
_MMA = ("QGMMA", "HGMMA", "HMMA")


@contextlib.contextmanager
def gpu_launch_path(run):
    """Inside, every Triton launch (interpreted: TRITON_INTERPRET=1) and every Gluon launch
    calls ``run(kernel, *args, grid=..., warmup=..., **kwargs)`` instead of running, and the
    launchers take their GPU branches (Gluon kernels, TMA descriptors), so CPU tensors of a
    workload's shapes go down the path a GPU call takes."""
    from triton.experimental.gluon._runtime import GluonJITFunction
    from triton.runtime.interpreter import InterpretedFunction

    from flamia.kernels import attn_bwd, attn_fwd, quantize

    patched = [(InterpretedFunction, "run"), (GluonJITFunction, "run"), (quantize, "interpreting"),
               (attn_fwd, "interpreting"), (attn_bwd, "interpreting")]
    saved = [getattr(owner, name) for owner, name in patched]
    InterpretedFunction.run = GluonJITFunction.run = run
    quantize.interpreting = attn_fwd.interpreting = attn_bwd.interpreting = lambda: False
    try:
        yield
    finally:
        for (owner, name), value in zip(patched, saved):
            setattr(owner, name, value)


def capture(workload: str, recipe: str, backward: bool = True, tiles: dict | None = None,
            options: dict | None = None) -> list[dict]:
    """Every kernel launch of one training call (forward + backward, or the forward alone) on
    ``workload``'s shapes, as {kernel, module, grid, args: [{kind, ...}], kwargs}; the kernels
    do not run. tiles: ``AttnTiles`` fields to change for the recipe's codes at the workload's
    head dim (a candidate's shared memory and registers before any device time); options:
    ``Recipe`` fields to change (e.g. ``{"bf16_scores": True}``)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton.language as tl
    from triton.experimental.gluon.language import _layouts as gl_layouts
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from flamia.bench.workloads import WORKLOADS, make_case
    from flamia import ops
    from flamia.recipes import resolve_recipe
    from flamia.spec import AttnSpec

    launches = []

    def describe(x):
        if isinstance(x, tl.dtype):  # a constexpr dtype: the operand format's CODES
            return {"kind": "dtype", "value": x.name}
        if isinstance(x, torch.Tensor):
            return {"kind": "tensor", "dtype": str(x.dtype).removeprefix("torch."), "ptr16": x.data_ptr() % 16 == 0}
        if isinstance(x, TensorDescriptor):  # a Gluon kernel's TMA operand
            return {"kind": "descriptor", "signature": mangle_type(x)}
        if isinstance(x, bool):
            return {"kind": "bool", "value": x}
        if isinstance(x, int):
            return {"kind": "int", "value": x}
        if isinstance(x, float):
            return {"kind": "float", "value": x}
        if x is None:
            return {"kind": "none"}
        if isinstance(x, gl_layouts.DistributedLayout):  # a Gluon kernel's constexpr layout
            return {"kind": "layout", "value": repr(x)}
        raise TypeError(f"unexpected launch argument {type(x).__name__}")

    def record(self, *args, grid, warmup, **kwargs):
        launches.append({"kernel": self.fn.__name__, "module": self.fn.__module__,
                         "args": [describe(a) for a in args], "kwargs": {k: describe(v) for k, v in kwargs.items()}})

    i = make_case(WORKLOADS[workload], "cpu").inputs
    recipe = resolve_recipe(recipe).with_(**(options or {}))
    if tiles:
        from dataclasses import replace

        from flamia.kernels import configs
        d = i.q.shape[-1]
        table = configs.tile_table(configs.route_for(recipe))
        table[d] = replace(table[d], **tiles)
    q, k, v = (x.detach().clone().requires_grad_() for x in (i.q, i.k, i.v))
    spec = AttnSpec(i.cu_seqlens, i.cu_seqlens, i.max_seqlen, i.max_seqlen, True, q.shape[-1] ** -0.5, (-1, -1),
                    recipe)
    # The GPU's Gluon launches too (Gluon has no interpreter): recorded, not run.
    with gpu_launch_path(record):
        out, _ = ops.attention(q, k, v, spec, "triton")
        if backward:
            torch.autograd.grad(out, (q, k, v), i.do)
    return launches


_TYPES = {"float8_e4m3fn": "*fp8e4nv", "int8": "*i8", "int32": "*i32", "int64": "*i64", "float32": "*fp32",
          "bfloat16": "*bf16", "float16": "*fp16"}


def compile_launch(launch: dict, seen: dict):
    """The cubin (bytes) of one recorded launch and its label (name, warps, stages, and #n for
    the n-th specialisation of a kernel); (None, None) for a specialisation already in
    ``seen`` (key -> label), which this updates."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    from flamia.kernels.launch import LAUNCH_OPTIONS, loose_params

    fn = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    names = fn.arg_names
    loose = loose_params(fn)  # ints Triton does not specialize on: their width alone
    options = {k: v["value"] for k, v in launch["kwargs"].items()
               if k in LAUNCH_OPTIONS and v["kind"] != "none"}
    given = dict(zip(names, launch["args"]))
    given.update({k: v for k, v in launch["kwargs"].items() if k not in options})
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(names):
        a = given[name]
        if index in fn.constexprs:
            signature[name] = "constexpr"
            constexprs[name] = False if name == "INTERPRET" else a.get("value")
            if a["kind"] == "dtype":
                constexprs[name] = triton.language.dtype(a["value"])
            if a["kind"] == "layout":  # rebuilt from its dataclass repr
                from triton.experimental.gluon.language import _layouts
                constexprs[name] = eval(a["value"], vars(_layouts))
        elif a["kind"] == "tensor":
            signature[name] = _TYPES[a["dtype"]]
            if a["ptr16"]:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif a["kind"] == "descriptor":
            signature[name] = a["signature"]
        elif a["kind"] == "none":
            signature[name], constexprs[name] = "constexpr", None
        elif a["kind"] == "int" and a["value"] == 1 and index not in loose:
            signature[name], constexprs[name] = "constexpr", 1
        elif a["kind"] == "int":
            signature[name] = "i32" if -2**31 <= a["value"] < 2**31 else "i64"
            if a["value"] % 16 == 0 and index not in loose:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif a["kind"] == "bool":
            signature[name] = "i1"
        else:
            signature[name] = "fp32"
    key = json.dumps([launch["kernel"], signature, constexprs, sorted(attrs), options], sort_keys=True, default=str)
    if key in seen:  # e.g. the K and Q quantizers: the same specialisation compiles once
        return None, None
    seen[key] = label = f"{launch['kernel']} w{options.get('num_warps', 4)} s{options.get('num_stages', 3)}"
    variants = sum(v.startswith(label) for v in seen.values())
    label = seen[key] = label if variants == 1 else f"{label} #{variants}"
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return {**compiled.asm, "shared": compiled.metadata.shared}, label


def _tool(name: str) -> str:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.path.exists(path) else name


def ptxas_warnings(ptx: str) -> list[str]:
    """ptxas's warnings on the kernel's PTX, which Triton does not show: C7512 says every
    wgmma of the kernel was serialized (each waits for the one before)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        from triton.backends.nvidia.compiler import get_ptxas
        ptxas = get_ptxas(90).path  # the ptxas Triton itself compiles sm_90a with
        run = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "kernel.cubin")],
                             capture_output=True, text=True)
    lines = (run.stdout + run.stderr).splitlines()
    if run.returncode:
        raise RuntimeError("ptxas failed on the kernel's PTX:\n" + "\n".join(lines[-20:]))
    return [line.strip() for line in lines if "warning" in line.lower()]


def disassemble(cubin: bytes) -> tuple[str, str]:
    """(SASS, resource usage) of a cubin, as cuobjdump prints them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return tuple(subprocess.run([_tool("cuobjdump"), flag, f.name], capture_output=True, text=True).stdout
                     for flag in ("-sass", "-res-usage"))


def read_sass(sass: str, usage: str) -> dict:
    """From a kernel's SASS and resource usage (``disassemble``): registers, local memory, QGMMA and spill counts, the opcode mix, the sizes of the loops
    that hold an MMA (a backward branch's body), each one's fewest and most instructions per
    pass (``_path_lengths``) and twelve commonest opcodes, and the smallest one's opcode mix,
    whole and on its straight path (``_straight_path``), and its MMA instructions with their
    shapes and types."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);", sass)
    code = [(int(addr, 16), op.split(".")[0], rest) for addr, _, op, rest in lines]
    full = {int(addr, 16): op for addr, _, op, _ in lines}  # with the shape and types, e.g. HGMMA.64x8x16.F32
    guarded = {int(addr, 16) for addr, pred, _, _ in lines if pred and not pred.strip().endswith("PT")}
    loops = []  # (first address, branch address) of each loop whose body holds an MMA
    for addr, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            if any(o in _MMA for a, o, _ in code if lo <= a <= addr):
                loops.append((lo, addr))
    loops.sort(key=lambda span: _count(code, *span))  # smallest first
    # The smallest loop with an MMA: the step loop. Where one loop serves masked and unmasked
    # tiles (the Gluon forward), a forward branch skips the mask: its straight path leaves out
    # every stretch that a forward branch inside the loop can jump over.
    lo, hi = loops[0] if loops else (1, 0)
    inner = [o for a, o, _ in code if lo <= a <= hi]
    straight = _straight_path(code, lo, hi)
    regs = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    ops = [o for _, o, _ in code]
    return {"regs": int(regs.get("REG", -1)), "stack_bytes": int(regs.get("STACK", -1)),
            "instructions": len(ops), "QGMMA": ops.count("QGMMA"), "HGMMA": ops.count("HGMMA"),
            "LDL/STL": ops.count("LDL") + ops.count("STL"),
            "opcodes": dict(collections.Counter(ops).most_common()),
            "mma_loops": [_count(code, *span) for span in loops],
            "mma_loop_paths": [_path_lengths(code, *span, guarded) for span in loops],
            "mma_loop_opcodes": [dict(collections.Counter(o for a, o, _ in code if lo_ <= a <= hi_).most_common(12))
                                 for lo_, hi_ in loops],
            "inner_loop": {"instructions": len(inner), "opcodes": dict(collections.Counter(inner).most_common()),
                           "mma": dict(collections.Counter(full[a] for a, o, _ in code if lo <= a <= hi and o in _MMA)),
                           "straight": {"instructions": len(straight),
                                        "opcodes": dict(collections.Counter(straight).most_common())}}}


def _path_lengths(code: list, lo: int, hi: int, guarded: set) -> tuple[int, int]:
    """The fewest and the most instructions from address lo to hi of ``code`` along forward
    branches, each guarded one (its address in ``guarded``: a predicate) taken or not, each
    unguarded one taken: one step of a loop whose body branches (masked and unmasked steps,
    4-bit and E4M3 tiles)."""
    where = {a: i for i, (a, _, _) in enumerate(code)}
    first, last = where[lo], where[hi]
    span = {last + 1: (0, 0)}  # instruction index -> (fewest, most) from it to hi
    for i in range(last, first - 1, -1):
        addr, op, rest = code[i]
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" and i < last else None
        if target and addr < int(target.group(1), 16):
            jump = span.get(where.get(int(target.group(1), 16), last + 1), (0, 0))
            options = (jump, span[i + 1]) if addr in guarded else (jump,)
            span[i] = (1 + min(o[0] for o in options), 1 + max(o[1] for o in options))
        else:
            span[i] = (1 + span[i + 1][0], 1 + span[i + 1][1])
    return span[first]


def _count(code: list, lo: int, hi: int) -> int:
    """Instructions at addresses lo..hi of ``code`` ((address, opcode, operands) each)."""
    return sum(lo <= a <= hi for a, _, _ in code)


def _straight_path(code: list, lo: int, hi: int) -> list:
    """The opcodes at addresses lo..hi without the stretches that a forward branch among them
    can skip (from the branch to its target)."""
    skipped = []
    for addr, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" and lo <= addr <= hi else None
        if target and addr < int(target.group(1), 16) <= hi:
            skipped.append((addr, int(target.group(1), 16)))
    return [o for a, o, _ in code if lo <= a <= hi and not any(b < a < t for b, t in skipped)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="eq8x8k")
    ap.add_argument("--recipe", default="mxfp8", help="a recipe the triton backend runs (mxfp8, bf16, nvfp4, fp4)")
    ap.add_argument("--bf16-scores", action="store_true", help="the recipe with bf16_scores (mxfp8, nvfp4)")
    ap.add_argument("--options", default="{}", help="Recipe fields to change, as JSON, e.g. '{\"p_sum_codes\": true}'")
    ap.add_argument("--kernels", default=".", help="regex on kernel names")
    ap.add_argument("--forward-only", action="store_true", help="the forward's launches alone")
    ap.add_argument("--tiles", default="{}", help="AttnTiles fields to change for the recipe at the workload's "
                    "head dim, as JSON, e.g. '{\"fwd_stages\": 3}'")
    ap.add_argument("--out", help="also write the report as JSON here")
    ap.add_argument("--sass-dir", help="also write each kernel's SASS here, as LABEL.sass")
    ap.add_argument("--capture", action="store_true", help=argparse.SUPPRESS)  # the first process
    args = ap.parse_args(argv)
    options = {**json.loads(args.options), **({"bf16_scores": True} if args.bf16_scores else {})}
    if args.capture:
        json.dump(capture(args.workload, args.recipe, not args.forward_only, json.loads(args.tiles), options),
                  sys.stdout)
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # Kernels imported under the interpreter cannot be compiled: run again without it.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)], env=env).returncode
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    recorded = subprocess.run([sys.executable, __file__, "--capture", "--workload", args.workload, "--recipe",
                               args.recipe, "--tiles", args.tiles, "--options", json.dumps(options)]
                              + ["--forward-only"] * args.forward_only, env=env,
                              capture_output=True, text=True, check=True).stdout
    report, seen = {}, {}
    for launch in json.loads(recorded):
        if not re.search(args.kernels, launch["kernel"]):
            continue
        asm, label = compile_launch(launch, seen)
        if asm is None:
            continue
        sass, usage = disassemble(asm["cubin"])
        report[label] = r = {**read_sass(sass, usage), "ptxas_warnings": ptxas_warnings(asm["ptx"]),
                             "shared_bytes": asm["shared"]}
        print(f"{label}: {r['regs']} registers, {r['stack_bytes']} B stack, {r['LDL/STL']} LDL/STL, "
              f"{r['QGMMA']} QGMMA, {r['HGMMA']} HGMMA, {r['shared_bytes']} B shared, {r['instructions']} instructions",
              flush=True)
        if args.sass_dir:
            os.makedirs(args.sass_dir, exist_ok=True)
            Path(args.sass_dir, re.sub(r"[^\w.-]+", "_", label) + ".sass").write_text(sass)
        for warning in r["ptxas_warnings"]:
            print(f"  ptxas: {warning}", flush=True)
        if r["mma_loops"]:
            step = r["inner_loop"]
            print(f"  loops with an MMA: {r['mma_loops']} instructions, per pass (fewest, most) "
                  f"{[tuple(p) for p in r['mma_loop_paths']]}; the smallest, "
                  f"{step['straight']['instructions']} on its straight path (forward branches taken): "
                  + ", ".join(f"{op} {n}" for op, n in list(step["straight"]["opcodes"].items())[:24]), flush=True)
    if args.out:
        json.dump({"workload": args.workload, "recipe": args.recipe, "options": options, "kernels": report},
                  open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
