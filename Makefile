# The two set-up commands of the README. Each installs what it needs into .venv first
# (make test also the PostgreSQL server binaries the suite starts a throwaway server from).
.PHONY: quickstart test test-slow test-all lint

quickstart:
	bash scripts/bootstrap.sh '[dashboard]'
	.venv/bin/explorer optimize studies/quickstart.yaml

test:
	bash scripts/bootstrap.sh '[test]'
	bash scripts/postgres.sh install
	.venv/bin/python -m pytest -q

test-slow:
	bash scripts/bootstrap.sh '[test]'
	bash scripts/postgres.sh install
	bash scripts/slurm.sh install
	.venv/bin/python -m pytest -q -m "slow and not gpu" --durations=30

test-all:
	bash scripts/bootstrap.sh '[test]'
	bash scripts/postgres.sh install
	bash scripts/slurm.sh install
	.venv/bin/python -m pytest -q -m "not gpu"

lint:
	bash scripts/bootstrap.sh '[test]'
	.venv/bin/ruff check explorer tests benchmarks
	.venv/bin/ruff format --check explorer tests benchmarks
	.venv/bin/mypy explorer
