"""Benchmarks: splice side by side with TorchRL 0.14.1 and the raw limit, in one process."""
