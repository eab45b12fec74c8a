"""Run pipes.cubin (experiment): per kernel, results per SM per clock of its main instruction."""
import ctypes, os, torch
torch.cuda.init(); torch.zeros(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")
mod = ctypes.c_void_p()
data = open(os.path.join(os.path.dirname(__file__), "pipes.cubin"), "rb").read()
assert cu.cuModuleLoadData(ctypes.byref(mod), data) == 0
sms = torch.cuda.get_device_properties(0).multi_processor_count
BLOCKS_PER_SM, THREADS, N, CH = 4, 256, 2048, 8
# ops per chain-iteration of the counted instruction class
KERNELS = {"k_hmul2_bf16": 1, "k_hadd2_bf16": 1, "k_hfma2_bf16": 1, "k_hmul2_f16": 1, "k_hfma2_f16": 1, "k_lop3": 1,
           "k_shf": 1, "k_prmt": 1, "k_ffma": 1, "k_iadd": 1, "k_cvt_pack": 1, "k_mix_decode": 1, "k_mix_fma": 1}
for name, ops in KERNELS.items():
    f = ctypes.c_void_p()
    assert cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()) == 0
    grid = sms * BLOCKS_PER_SM
    out = torch.empty(grid * THREADS, dtype=torch.int32, device="cuda")
    cyc = torch.zeros(grid, dtype=torch.int64, device="cuda")
    for rep in range(2):
        a = [ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(cyc.data_ptr()), ctypes.c_int(N)]
        args = (ctypes.c_void_p * 3)(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in a])
        assert cu.cuLaunchKernel(f, grid, 1, 1, THREADS, 1, 1, 0, None, args, None) == 0
        torch.cuda.synchronize()
    c = cyc.float().median().item()
    per_sm_clk = N * CH * ops * THREADS * BLOCKS_PER_SM / c
    print(f"{name:14s} {c:10.0f} cycles  {per_sm_clk:7.1f} per SM per clock  ({per_sm_clk / 128:.2f} warp-instr/SMSP/clk)"
          if not name.startswith("k_mix") else
          f"{name:14s} {c:10.0f} cycles  {N * CH * THREADS * BLOCKS_PER_SM * 8 / c:7.1f} weights decoded per SM per clock "
          f"-> {c / (N * CH) / (THREADS * BLOCKS_PER_SM / 32 / 4):.1f} cycles per word per warp/SMSP")
