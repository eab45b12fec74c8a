"""The route-major decode kernels: descriptor, knobs and when a call uses them (family)."""
