"""The GPU architectures the package builds kernels for: the one definition every other module imports.

``ARCHS`` are ``--gpu-arch`` values of the CuTe DSL (the loader, the AOT build and the portable warp-MMA
family use them all); ``SM90_ARCHS`` are the archs of the WGMMA and decode families. No imports: the
loader, the AOT command line and the family modules read this without torch or the DSL.
"""

__all__ = ["ARCHS", "SM90_ARCHS", "PDL_ARCHS", "DEFAULT_SM_COUNT", "SMEM_PER_SM", "CTA_SMEM_RESERVE", "arch_of_capability"]

#: every arch the loader, the AOT build and the warp-MMA family accept
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a")
#: the archs of the SM90 families (WGMMA grouped GEMM, route-major decode kernels)
SM90_ARCHS = ("sm_90a",)
#: the archs of SM90 and later (programmatic dependent launch; the CuTe routing family)
PDL_ARCHS = tuple(a for a in ARCHS if int(a[3:].rstrip("a")) >= 90)
#: SM count assumed by selection when a call has no device to ask (tuner unit tests): an H100 / H200 SXM
DEFAULT_SM_COUNT = 132
#: shared memory per SM of each arch in bytes (CUDA programming guide, "technical specifications per compute
#: capability"): what bounds how many CTAs of a shared-memory-heavy kernel one SM holds
SMEM_PER_SM = {"sm_80": 164 << 10, "sm_86": 100 << 10, "sm_89": 100 << 10, "sm_90a": 228 << 10,
               "sm_100a": 228 << 10, "sm_103a": 228 << 10, "sm_120a": 100 << 10}
#: shared memory the CUDA runtime reserves per CTA (1 KB from sm_80 on)
CTA_SMEM_RESERVE = 1 << 10


def arch_of_capability(major: int, minor: int) -> str:
    """The ``--gpu-arch`` name kernels are built for on a GPU of compute capability ``major.minor``: the
    arch-specific ``a`` targets from SM90 on (``sm_90a``, ``sm_100a``, ``sm_120a``), plain ``sm_80`` /
    ``sm_86`` / ``sm_89`` before."""
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")
