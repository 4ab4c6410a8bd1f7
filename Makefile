# The two commands of the README. Each sets everything up first (idempotent).
.PHONY: demo test fast-test lint

demo:
	bash scripts/setup.sh demo
	.venv/bin/kvmoq demo

test:
	bash scripts/setup.sh
	bash scripts/test.sh

fast-test:
	bash scripts/setup.sh
	bash scripts/test.sh -m "not slow"

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
