"""What a compiled C++ kernel needs of the machine it runs on, and whether this one has
it: recorded at capture, checked at load by cheap CPU-feature queries (no compiler runs,
``torch._inductor`` is not imported on the check)."""

from __future__ import annotations

import platform
import sysconfig
from typing import Any

import torch

_X86_FLAG_CHECKS = {
    "avx2": "_is_avx2_supported",
    "avx512": "_is_avx512_supported",
    "avx512_vnni": "_is_vnni_supported",
    "avx512_bf16": "_is_avx512_bf16_supported",
    "amx_tile": "_is_amx_tile_supported",
    "amx_fp16": "_is_amx_fp16_supported",
}


def kernel_platform() -> dict[str, Any]:
    """What a compiled C++ kernel of this process depends on: the torch build (its kernel
    prefix header and tensor accessor), the Python extension ABI, the machine, and the
    vector ISA Inductor picked here (recorded as its feature flags)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return {
        "torch": str(torch.__version__),
        "python_abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "machine": platform.machine(),
        "isa": str(isa) or "none",
        "isa_flags": str(isa).split(),
    }


def kernel_platform_problem(required: dict[str, Any]) -> str | None:
    """Why kernels built for ``required`` cannot run here, or None. Answers from cheap
    CPU-feature queries: no compiler runs and ``torch._inductor`` is not imported."""
    here = {
        "torch": str(torch.__version__),
        "python_abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "machine": platform.machine(),
    }
    for key, value in here.items():
        if required.get(key) != value:
            return f"they were built for {key} {required.get(key)!r}, this process has {value!r}"
    for flag in required.get("isa_flags", []):
        check = _X86_FLAG_CHECKS.get(flag)
        if check is None or not getattr(torch.cpu, check, lambda: False)():
            return f"they use the {required.get('isa')} vector ISA, and this CPU lacks {flag!r}"
    return None
