"""Route preparation and deterministic finalize as prebuilt CuTe DSL kernels (family ``w4a16_route_prep``).

:mod:`.config` (static config, no DSL), :mod:`.kernels` (the DSL kernels), :mod:`.family` (specs and variants
for the loader), :mod:`.launch` (host functions with the Triton routing / finalize contract).
Importing this package imports neither ``cutlass`` nor ``triton``.
"""
