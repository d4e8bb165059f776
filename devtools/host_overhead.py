"""Where the host time of a tiny derived attention call goes (H200 lease; a developer script).

    python3 devtools/host_overhead.py     # prints µs per call of each component, 2000 calls each
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_call(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    import torch

    import derivc
    from codegen.cuda.runtime import _torch_stream

    k = derivc.build(ROOT / "examples" / "flash_attention.yaml", Path(tempfile.mkdtemp()) / "fa")
    q, kk, v = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    ck = k._kernel
    k(q, kk, v, out=o)
    geo = next(iter(ck._shapes.values()))
    launch = ck.printed.variants[0].launch
    vals = (q.data_ptr(), kk.data_ptr(), v.data_ptr(), o.data_ptr(), *geo.size_args)
    rows = {
        "whole call (out= given)": lambda: k(q, kk, v, out=o),
        "CompiledKernel call": lambda: ck(q, kk, v, out=o),
        "driver launch only": lambda: ck._fns[0].launch(geo.grids[0], launch.threads, launch.smem_bytes, _torch_stream(0), vals),
        "5x (dtype, is_contiguous, get_device, data_ptr, shape)": lambda: [(x.dtype, x.is_contiguous(), x.get_device(), x.data_ptr(), x.shape) for x in (q, kk, v, o, o)],
        "torch stream handle": lambda: _torch_stream(0),
        "torch.add (a small torch op, for scale)": lambda: torch.add(q, kk, out=o),
    }
    for name, fn in rows.items():
        print(f"{per_call(fn):7.2f} us  {name}")
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
