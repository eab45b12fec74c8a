"""Static configuration of one SM90 W4A16 grouped-GEMM kernel (no CuTe DSL import).

Kept apart from the kernel module so that selecting kernels and looking up prebuilt ones at run time
never imports ``cutlass``: a prebuilt wheel runs without the DSL installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.codes import act_tag, is_gated, resolve_epilogue

__all__ = ["Sm90GemmConfig", "check_setmaxnreg", "pingpong_unordered"]


def pingpong_unordered(stages: int, nk: int) -> bool:
    """Whether the two consumer warpgroups of a ``pingpong=2`` kernel with ``stages`` ring stages run their
    mainloops unordered for a split of ``nk`` K tiles (the kernel tests its run-time ``nk`` against the values
    this admits). A warpgroup waiting on ring sequence ``g`` (row block ``g // nk``, warpgroups alternating
    by row block) tests the parity of the stage's phase; that test is sound only once the stage's previous
    fill, ``g - stages``, has landed, which the warpgroup knows only if it consumed that fill itself. With
    ``stages`` a multiple of ``2 nk``, ``g - stages`` lies ``stages / nk`` (even) row blocks back: its own.
    Otherwise (``stages = 4, nk = 3``: ``g - 4`` is in the other warpgroup's row block, its fill perhaps still
    in flight) the wait can pass a phase early; the mainloops then take turns, which is always sound."""
    return nk > 0 and stages % (2 * nk) == 0


def check_setmaxnreg(cfg: "Sm90GemmConfig", entry_regs: int) -> None:
    """``setmaxnreg.inc`` blocks until the CTA's pool holds the registers asked for, and the pool only
    holds what the kernel was launched with: a kernel whose entry register count (from the cubin)
    is below what the budgets need would hang. Call after compiling a ``setmaxnreg`` kernel."""
    if cfg.setmaxnreg:
        need = cfg.producer_regs * 128 + cfg.consumer_regs * 128 * cfg.consumer_wgs
        have = entry_regs * 128 * (1 + cfg.consumer_wgs)
        if need > have:
            raise RuntimeError(f"{cfg.name()}: setmaxnreg budgets need {need} registers, launch gives {have}")


@dataclass(frozen=True)
class Sm90GemmConfig:
    """Static configuration of one compiled kernel."""

    mode: str = "gate_up"  # "gate_up" | "down"
    dtype: str = "bf16"  # activation / compute dtype: "bf16" | "fp16"
    group: int = 32  # scale group along K; 0 = per channel (any group >= k_tile behaves the same)
    m64_per_block: int = 2  # X: m64 blocks (64 weight rows each) per CTA
    tokens_per_tile: int = 32  # TN: WGMMA N, multiple of 8 in [8, 256]
    k_tile: int = 128  # BK: K per pipeline stage, multiple of 64
    stages: int = 4
    activation: str = "swiglu"  # gate_up only: a canonical activation name ("swiglu_oai(alpha=A,limit=L)" too)
    # per-expert FP32 bias added in the epilogue (gate_up: w13 bias before the activation; down: the "y"
    # epilogue only), read from the launch ABI's topk_weights slot (see common.epilogue)
    bias: bool = False
    zero_point: bool = False
    fp4: bool = False  # E2M1 codes (NVFP4 / MXFP4; scales pre-multiplied at pack time, see pack.py)
    epilogue: str = "auto"  # gate_up: "h"; down: "y" | "atomic_f32"
    consumer_wgs: int = 1
    schedule: str = "overlap"  # "overlap" | "serial"
    evict_first: bool = True  # L2 evict-first hint on the streamed weights
    min_ctas_per_sm: int = 1  # > 1: ptxas caps registers so that many CTAs fit on an SM
    row_blocks_per_cta: int = 1  # RB: consecutive row blocks per CTA, one weight stream (short-K down GEMMs)
    # RB > 1, two consumer WGs, each owning whole row blocks, alternately: 0 off; 1 their mainloops take
    # turns; 2 they take turns only where running unordered is not sound (pingpong_unordered)
    pingpong: int = 0
    b_slots: int = 0  # RB > 1: activation-tile slots (0 = stages); fewer than stages frees shared memory
    # token-tile widths compiled into one kernel: TN, TN - 8, ..., TN - 8 * (tn_variants - 1); each tile runs
    # the narrowest WGMMA N that holds its routes (fewer padded MMA columns when experts get < TN routes)
    tn_variants: int = 1
    # programmatic dependent launch (both kernels launched with the PDL attribute): gate_up CTAs set up while
    # the route preparation finishes, wait for it, then let the down kernel launch; the down kernel streams
    # its first weight stages before griddepcontrol.wait and lets the finalize launch at once
    pdl: bool = False
    # k16 blocks per WGMMA group in the overlap schedule: decode that many blocks, one wgmma.fence, their
    # WGMMAs, one commit (fewer warpgroup-wide fences per K tile); must divide k_tile / 16
    mma_kblocks: int = 1
    setmaxnreg: bool = False  # rebalance registers (consumer_wgs == 2 only; see check_setmaxnreg)
    producer_regs: int = 56
    consumer_regs: int = 224
    # down "y" epilogue without bias: stage the accumulators as 16-bit values (x's dtype: the rounding y gets
    # anyway) instead of FP32, half the staging tile and its shared-memory traffic; split-K partials then go from
    # the accumulators straight to the FP32 workspace
    stage16: bool = False

    @property
    def gated(self) -> bool:
        return is_gated(self.mode, self.activation)

    @property
    def epi(self) -> str:
        return resolve_epilogue(self.mode, self.epilogue)

    def name(self) -> str:
        g = "ch" if self.group == 0 else str(self.group)
        act = ("_" + act_tag(self.activation)) if self.mode == "gate_up" else ""
        act += "_bias" if self.bias else ""
        zp = ("zp" if self.zero_point else "") + ("f4" if self.fp4 else "")
        sch = ("" if self.schedule == "overlap" else "_ser") + ("_mr" if self.setmaxnreg else "")
        sch += f"_o{self.min_ctas_per_sm}" if self.min_ctas_per_sm > 1 else ""
        sch += f"_r{self.row_blocks_per_cta}" if self.row_blocks_per_cta > 1 else ""
        sch += {0: "", 1: "_pp"}.get(self.pingpong, f"_pp{self.pingpong}")
        sch += f"_b{self.b_slots}" if self.b_slots else ""
        sch += f"_v{self.tn_variants}" if self.tn_variants > 1 else ""
        sch += "_pdl" if self.pdl else ""
        sch += f"_f{self.mma_kblocks}" if self.mma_kblocks > 1 else ""
        sch += "_e16" if self.stage16 else ""
        return (
            f"sm90_{self.mode}_{self.dtype}_g{g}{zp}_x{self.m64_per_block}_t{self.tokens_per_tile}"
            f"_k{self.k_tile}_s{self.stages}_w{self.consumer_wgs}_{self.epi}{act}{sch}"
        )
