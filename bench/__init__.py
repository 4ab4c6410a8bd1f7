"""Benchmarks behind `kvmoq bench NAME`; each prints its figures next to a baseline measured in the same run."""
