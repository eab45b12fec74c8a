"""The SM90 (Hopper WGMMA) W4A16 grouped GEMM: static configuration and kernel."""
