"""Constants shared by the CuTe kernels' configs, the kernels and host code (no ``cutlass`` import).

* :data:`ACT_CODES` / :data:`GATED`: the activation kinds a gate/up kernel fuses and which of them are gated
  (gate and up halves: ``act(gate) * up``); a config's ``activation`` is the canonical activation name
  (:mod:`w4a16_moe.activations`: ``"swiglu_oai(alpha=A,limit=L)"`` for custom gpt-oss parameters, whose
  kind is ``swiglu_oai``; :func:`act_kind`, :func:`act_tag` its name-safe form in config names)
  (:func:`is_gated`; :func:`resolve_epilogue` resolves a grouped GEMM's ``epilogue="auto"``);
* :data:`MODES` / :data:`DTYPES`: a kernel's GEMM (``gate_up`` | ``down``) and activation / compute dtype names
  (``bf16`` | ``fp16``); the ``check_*`` functions raise ``ValueError`` naming a bad field;
* the 16-bit bit patterns the INT4 decode uses, per dtype name, both halves of a packed word:
  :data:`INT4_MAGIC` (exponent magic OR-ed onto a nibble: bf16 ``0x4300`` = 128.0, fp16 ``0x6400`` = 1024.0),
  :data:`INT4_SYM_BIAS` (``-(magic + 8)``: the symmetric decode's bias), :data:`ONE_X2` (1.0) and
  :data:`NEG_ZERO_X2` (-0.0, the addend of an exact scale FMA).
"""

from __future__ import annotations

__all__ = [
    "ACT_CODES", "GATED", "MODES", "DTYPES", "INT4_MAGIC", "INT4_SYM_BIAS", "ONE_X2", "NEG_ZERO_X2", "is_gated",
    "resolve_epilogue", "check_dtype", "check_mode_dtype", "check_activation", "check_epilogue", "check_bias",
    "act_kind", "act_params", "act_tag",
]

ACT_CODES = {"swiglu": 0, "geglu": 1, "relu2": 2, "silu": 3, "swiglu_oai": 4}
GATED = frozenset({"swiglu", "geglu", "swiglu_oai"})

MODES = ("gate_up", "down")
DTYPES = ("bf16", "fp16")

INT4_MAGIC = {"bf16": 0x43004300, "fp16": 0x64006400}
INT4_SYM_BIAS = {"bf16": 0xC308C308, "fp16": 0xE408E408}
ONE_X2 = {"bf16": 0x3F803F80, "fp16": 0x3C003C00}
NEG_ZERO_X2 = 0x80008000


def check_dtype(dtype: str) -> None:
    """Raise ``ValueError`` naming ``dtype`` unless it is one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}")


def act_kind(activation: str) -> str:
    """The kind of an activation name (``"swiglu_oai(alpha=1.5,limit=2.0)"`` -> ``"swiglu_oai"``)."""
    return activation.partition("(")[0]


def act_params(activation: str) -> tuple:
    """``(alpha, limit)`` of a ``swiglu_oai`` name (the defaults for ``"swiglu_oai"``); ``ValueError`` for a bad
    name."""
    from ....activations import get_activation

    a = get_activation(activation)
    if a.kind != "swiglu_oai" or a.name != activation:
        raise ValueError(f"activation {activation!r}: expected a canonical swiglu_oai name")
    return a.alpha, a.limit


def act_tag(activation: str) -> str:
    """The activation's part of a config name: the name itself, ``swiglu_oai_a1p5_l2p0`` for custom gpt-oss
    parameters (letters, digits and ``_`` only)."""
    if activation.startswith("swiglu_oai("):
        alpha, limit = act_params(activation)
        return f"swiglu_oai_a{alpha!r}_l{limit!r}".replace(".", "p").replace("-", "m").replace("+", "")
    return activation


def is_gated(mode: str, activation: str) -> bool:
    """Whether a kernel of ``mode`` fuses a gated activation (gate_up with swiglu / geglu / swiglu_oai: gate and
    up halves)."""
    return mode == "gate_up" and act_kind(activation) in GATED


def resolve_epilogue(mode: str, epilogue: str) -> str:
    """A grouped GEMM config's epilogue: ``epilogue`` unless ``"auto"`` (gate_up: ``"h"``, down: ``"y"``)."""
    if epilogue != "auto":
        return epilogue
    return "h" if mode == "gate_up" else "y"


def check_mode_dtype(mode: str, dtype: str) -> None:
    """Raise ``ValueError`` unless ``mode`` is one of :data:`MODES` and ``dtype`` one of :data:`DTYPES`."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}")
    check_dtype(dtype)


def check_activation(mode: str, activation: str) -> None:
    """Raise ``ValueError`` unless a gate_up kernel's ``activation`` is one of :data:`ACT_CODES` (or a canonical
    ``swiglu_oai(alpha=A,limit=L)`` name)."""
    if mode != "gate_up":
        return
    if activation.startswith("swiglu_oai("):
        act_params(activation)
    elif activation not in ACT_CODES:
        raise ValueError(f"activation {activation!r}")


def check_bias(mode: str, epi: str, bias: bool) -> None:
    """Raise ``ValueError`` for a bias on the ``atomic_f32`` epilogue (the provider starts the fused finalize's
    FP32 accumulator from the routes' weighted biases instead: the epilogue's ``topk_weights`` slot is taken)."""
    if bias and mode == "down" and epi == "atomic_f32":
        raise ValueError("bias: the atomic_f32 epilogue takes no bias (the fused finalize's accumulator starts "
                         "from the weighted w2 biases)")


def check_epilogue(mode: str, epi: str) -> None:
    """Raise ``ValueError`` unless a grouped GEMM's resolved epilogue fits its mode (gate_up: ``h``; down:
    ``y`` | ``atomic_f32``)."""
    if mode == "gate_up" and epi != "h":
        raise ValueError(f"gate_up epilogue {epi!r}")
    if mode == "down" and epi not in ("y", "atomic_f32"):
        raise ValueError(f"down epilogue {epi!r}")
