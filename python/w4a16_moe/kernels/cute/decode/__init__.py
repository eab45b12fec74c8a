"""The route-major decode kernels: static configuration and kernel."""
