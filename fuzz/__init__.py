"""Coverage-guided fuzzing of every parser that reads bytes from outside the process.

`python -m fuzz TARGET [libFuzzer flags]` runs one target under atheris (libFuzzer for
Python, coverage from sidecar's own bytecode); `python -m fuzz --list` names them. A target
feeds the bytes to one parser and accepts only the errors that parser documents for bad
input; any other exception is a crash, which atheris reports with the input that caused it
and exits non-zero. tests/test_fuzz.py runs every target for a bounded number of inputs;
docs/reliability.md records a longer run.
"""
