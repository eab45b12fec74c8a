import importlib.util, json, os, sys
import torch, w4a16_moe as wm
from w4a16_moe.loader import prebuilt, torch_op
from w4a16_moe.kernels.cute import provider
print("w4a16_moe from", wm.__file__, "| torch", torch.__version__, "| cutlass importable:", importlib.util.find_spec("cutlass") is not None)
print("prebuilt per arch:", prebuilt.summary().get("per_arch"), "| torch op:", torch_op.load())
g = torch.Generator().manual_seed(0)
w = wm.quantize_experts(torch.randn(8, 512, 512, generator=g).bfloat16() / 20, torch.randn(8, 512, 256, generator=g).bfloat16() / 16, "int4_g32").to("cuda")
x = torch.randn(5, 512, device="cuda").bfloat16()
ids = torch.randint(0, 8, (5, 2), device="cuda", dtype=torch.int32); ids[:, 1] = (ids[:, 0] + 1) % 8
tw = torch.rand(5, 2, device="cuda")
y = wm.fused_moe(x, w, tw, ids, backend="cute")
ref = wm.reference_moe(x, w, tw, ids)
print("nrmse", ((y.float() - ref).norm() / ref.norm()).item())
launchers = [l for _, l in provider._LAUNCHERS.values()]
print("launchers:", launchers)
assert launchers and all(l is not None for l in launchers), "kernels did not launch through the torch op"
assert wm.__file__.startswith(os.environ["SITE"])
