"""Observing: ncu's command line and exports, kernel names, the machine, PyTorch traces."""
