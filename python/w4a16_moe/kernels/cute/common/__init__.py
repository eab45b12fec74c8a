"""Device-code pieces shared by the CuTe DSL kernels (PTX helpers, epilogue blocks) and their cutlass-free constants."""
