"""The SM90 WGMMA kernel family: descriptor and tile selection (family), packed layout (pack), tuned table (tuned)."""
