"""The portable warp-MMA (mma.sync) kernel family: descriptor and tile selection (family), packed layout (pack)."""
