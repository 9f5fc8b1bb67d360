# Everything runs on Node 24. When the machine's node is older, Node 24 comes from the npm
# registry (the node-linux-<arch> package ships the official binary) into .tools/, and every
# target puts it first on PATH, so npm, tsc and tap run on it too.
SHELL := /bin/bash
NODE_MAJOR_WANTED := 24
ARCH := $(shell uname -m | sed -e 's/x86_64/x64/' -e 's/aarch64/arm64/')
SYSTEM_NODE_MAJOR := $(shell node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
ifeq ($(shell [ "$(SYSTEM_NODE_MAJOR)" -ge "$(NODE_MAJOR_WANTED)" ] && echo ok),ok)
  NODE_DIR :=
else
  NODE_DIR := $(CURDIR)/.tools/node$(NODE_MAJOR_WANTED)/node_modules/node-linux-$(ARCH)/bin
  export PATH := $(NODE_DIR):$(PATH)
endif
NODE := node

.DEFAULT_GOAL := help
# Biome and squawk come as their platform packages (optional dependencies), called directly.
BIOME := node_modules/@biomejs/cli-linux-$(ARCH)/biome
SQUAWK := node_modules/@squawk-cli/linux-$(ARCH)/bin/squawk
.PHONY: help setup run test test-faults soak format check links schema client audit bench clean node

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

node: $(if $(NODE_DIR),$(NODE_DIR)/node)
$(NODE_DIR)/node:
	@echo "node $(SYSTEM_NODE_MAJOR) is older than $(NODE_MAJOR_WANTED): fetching Node $(NODE_MAJOR_WANTED) from the npm registry into .tools/"
	@mkdir -p .tools/node$(NODE_MAJOR_WANTED)
	@cd .tools/node$(NODE_MAJOR_WANTED) && echo '{"private":true}' > package.json && \
	  npm install --no-save --no-audit --no-fund --loglevel=error node-linux-$(ARCH)@$(NODE_MAJOR_WANTED)
	@$(NODE_DIR)/node --version

node_modules/.installed: package.json package-lock.json clients/typescript/package.json | node
	npm ci --no-audit --no-fund --loglevel=error
	@# tap builds its plugin set at install; rebuild it for the plugins package.json asks for
	@# (TypeScript runs on Node's own type stripping, not through a tap plugin).
	npx tap build
	@touch $@

setup: node_modules/.installed ## install Node 24 (if needed) and the dependencies

# V8's heap for the service's process (docs/performance.md, "Streaming export"): a young generation
# of 4 MiB semi-spaces and a 128 MiB old-generation limit keep an export of 1,000,000 rows under 200 MiB of
# RSS. V8 sizes its heap when the process starts, so they go on the command line (or in
# NODE_OPTIONS: docs/operations.md); `make bench` hands them to the API processes it starts.
SERVICE_NODE_FLAGS := --max-semi-space-size=4 --max-old-space-size=128

run: setup ## start PostgreSQL (embedded unless DATABASE_URL is set), migrate, serve API and worker on PORT (3000)
	$(NODE) $(SERVICE_NODE_FLAGS) bin/crm.js serve

test: setup ## run every test against a real PostgreSQL (embedded unless DATABASE_URL is set)
	$(NODE) test/run.ts

test-faults: setup ## run the fault tests (kill -9, PostgreSQL restart, slow receivers) and the scale-out test
	$(NODE) test/run.ts 'test/faults/*.test.ts' 'test/scale/*.test.ts'

soak: setup ## run the soak test at full length (SOAK_SECONDS, default 300): mixed load, memory, p50/p99
	SOAK_SECONDS=$${SOAK_SECONDS:-300} $(NODE) test/run.ts --timeout=900 test/soak/soak.test.ts

format: setup ## format the code and apply Biome's safe lint fixes (biome.jsonc)
	$(BIOME) check --write

check: setup ## verify format and lint (biome ci), type-check (tsc --noEmit), lint the migrations (squawk), the import graph's layers and circles, the OpenAPI document (redocly lint, no warning), the links (make links)
	$(BIOME) ci
	npx tsc --noEmit -p .
	$(SQUAWK) sql/migrations/*.sql sql/definitions/*.sql
	$(NODE) test/helpers/import-graph.ts
	$(NODE) test/helpers/openapi-lint.ts
	@$(MAKE) --no-print-directory links

links: setup ## check every link and #anchor between the Markdown files, and to the files they name (remark-validate-links, .remarkrc.mjs)
	@# Every Markdown file of the project (.remarkignore leaves out dependencies and local data); a
	@# warning fails the target (--frail). Local files only: nothing is fetched.
	npx remark . --quiet --frail --no-stdout

schema: setup ## write sql/schema.sql: migrate a throwaway embedded PostgreSQL and dump the schema crm
	$(NODE) src/db/schema-dump.ts

client: setup ## regenerate the TypeScript client's types (clients/typescript/schema.ts) from /api/openapi.json (URL=... to read a running service's) and compile the package (clients/typescript/dist, not committed)
	$(NODE) clients/typescript/generate.ts $(URL)
	cd clients/typescript && npx tsc -p tsconfig.build.json

audit: setup ## npm audit of every dependency: fails on a high or critical finding
	@# A registry that does not serve the audit endpoint (some mirrors answer 405) is reported as
	@# not checked, loudly, rather than as a pass or a failure.
	@out=$$(npm audit --audit-level=high 2>&1); status=$$?; \
	echo "$$out" | grep -v 'Unknown user config'; \
	if [ $$status -ne 0 ] && echo "$$out" | grep -q 'audit endpoint returned an error'; then \
	  echo "audit: NOT CHECKED: the registry did not answer the audit endpoint"; exit 0; \
	fi; exit $$status

bench: setup ## run the benchmarks and write bench/RESULTS.md
	SERVICE_NODE_FLAGS='$(SERVICE_NODE_FLAGS)' $(NODE) bench/run.ts

clean: ## remove dependencies, Node 24 and local data (.data/ holds the embedded database)
	rm -rf node_modules .tools .data .tap coverage
