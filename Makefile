# The two commands of the operations contract (`make run`, `make test`), plus helpers.
# Each target installs what it needs: `run` the server alone, the others the dev tools too.
PYTHON ?= python3
# pytest-xdist workers of `make test`: much of the suite waits on server processes, registries
# and browsers, so three workers keep two cores busier than two do
TEST_WORKERS ?= 3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
RUN_STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck openapi install test-services bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(RUN_STAMP)

install: $(STAMP)

# Migrates once, here (the server is told not to migrate again). The server prints the admin
# API key at the first start only; later starts say where it is kept.
run: $(RUN_STAMP)
	$(BIN)/nvcf-server migrate
	@echo "nvcf-server: API at http://127.0.0.1:8080, docs at /docs and /redoc"
	NVCF_AUTO_MIGRATE=false $(BIN)/nvcf-server serve --host 127.0.0.1 --port 8080

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

# mypy (service/ and tests/, pyproject's packages: 45 CPU s of one core from a cold cache) runs
# beside the suite, which mostly waits on servers; its report is printed after pytest's, and
# either failing fails `make test`.
# compileall first: where PYTHONDONTWRITEBYTECODE is set (this machine sets it), every server
# process a test starts compiles the sources again: half a CPU second each, about a hundred
test: $(STAMP) test-services lint
	$(BIN)/python -m compileall -q service tests >/dev/null
	@types=$$(mktemp); $(BIN)/mypy >"$$types" 2>&1 & mypy=$$!; \
	NVCF_TEST_REQUIRE_SERVICES=1 $(BIN)/python -m pytest -q -p no:cacheprovider \
		-n $(TEST_WORKERS); tests=$$?; \
	wait $$mypy; typed=$$?; \
	echo "--- mypy (exit $$typed)"; cat "$$types"; rm -f "$$types"; \
	test $$tests -eq 0 && test $$typed -eq 0

bench: $(STAMP)
	$(BIN)/python bench/api.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
