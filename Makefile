# Targets for developers and operators; `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: help install demo run scheduler dashboard test test-fast lint format bench services up down

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install:  ## Create .venv and install the project with its dev tools
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'

demo:  ## Watch a realistic workload flow through the system (~1.5 min; needs RabbitMQ and a state store)
	$(BIN)/python -m demo

run:  ## Run the worker (dramatiq actors) against the configured broker
	$(BIN)/jobctl worker

scheduler:  ## Run the scheduler process
	$(BIN)/python -m scheduler

dashboard:  ## Serve the operators' dashboard on http://127.0.0.1:8181 (needs DASHBOARD_ADMIN_PASSWORD)
	$(BIN)/jobctl dashboard

test:  ## Run both test tiers (real RabbitMQ, Redis, worker subprocesses; CI runs this): two at a time, then the exclusive ones alone
	$(BIN)/pytest -n 2 --durations=20 -m "not exclusive" tests/unit tests/integration
	$(BIN)/pytest --durations=5 -m exclusive tests/integration

test-fast:  ## Run the unit tier only: in-process, Redis and SQLite, no RabbitMQ (under 30 s)
	$(BIN)/pytest tests/unit

lint:  ## ruff check, ruff format --check and mypy (the tests too)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy jobsystem actors middleware scheduler jobctl demo dashboard bench tests

format:  ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench:  ## Throughput and send-rate benchmarks (prints figures, asserts nothing)
	$(BIN)/python -m bench

services:  ## Start the local RabbitMQ (with management) and Redis if they are installed but not running
	scripts/services.sh

up:  ## Start the whole system with docker compose (needs .env: see .env.example)
	@test -f .env || { echo "make up: no .env. Copy .env.example to .env and fill in random passwords." >&2; exit 1; }
	docker compose up --build -d

down:  ## Stop it
	docker compose down
