"""The portable warp-MMA (mma.sync) W4A16 grouped GEMM: static configuration and kernel."""
