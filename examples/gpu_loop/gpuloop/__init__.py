"""The GPU loop of run_loop.py, one module per phase."""
