"""Route preparation (prepare) and the fixed-order finalize (finalize): shared by both GPU providers."""
