# The two commands of operations.md §1, plus helpers. Each target installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint typecheck openapi install test-services bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/nvcf-server migrate
	@$(BIN)/python scripts/print_admin_key.py
	$(BIN)/nvcf-server serve --host 127.0.0.1 --port 8080

test-services:
	bash scripts/install-test-services.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

openapi: $(STAMP)
	$(BIN)/python scripts/export_openapi.py
	$(BIN)/python scripts/export_settings_doc.py

test: $(STAMP) test-services lint typecheck
	NVCF_TEST_REQUIRE_SERVICES=1 $(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python bench/api.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
