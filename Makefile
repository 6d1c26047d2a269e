GOBIN ?= $(shell go env GOPATH)/bin
BUF_VERSION ?= v1.75.0
OAPI_CODEGEN_VERSION ?= v2.8.2
CONTROLLER_GEN_VERSION ?= v0.23.0

.PHONY: generate check-generated envd tools

# generate regenerates the code under api/gen: protobuf and Connect from
# the .proto files, the REST types (api/gen/rest) from api/openapi/agentbox.yaml;
# and the Kubernetes kinds' deepcopy code and CRDs (deploy/k8s/crds) from
# internal/kube/apis.
generate: tools
	cd api && PATH="$(GOBIN):$$PATH" buf generate
	cd api/openapi && $(GOBIN)/oapi-codegen -config oapi-codegen.yaml agentbox.yaml
	$(GOBIN)/controller-gen object paths=./internal/kube/apis/... crd:maxDescLen=200 paths=./internal/kube/apis/... output:crd:artifacts:config=deploy/k8s/crds

# check-generated fails when api/gen or go.mod/go.sum are stale (regenerates
# them and compares).
check-generated:
	bash scripts/check-generated.sh

tools:
	@test -x $(GOBIN)/buf || go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@test -x $(GOBIN)/protoc-gen-go || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	@test -x $(GOBIN)/protoc-gen-connect-go || go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
	@$(GOBIN)/controller-gen --version 2>/dev/null | grep -qx 'Version: $(CONTROLLER_GEN_VERSION)' || go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	@$(GOBIN)/oapi-codegen --version 2>/dev/null | grep -qx '$(OAPI_CODEGEN_VERSION)' || go install github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@$(OAPI_CODEGEN_VERSION)

# envd builds the in-sandbox daemon as a static binary.
envd:
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/envd ./cmd/envd

.PHONY: dashboard

# dashboard rebuilds the web dashboard (web/dashboard, pinned npm packages)
# into internal/dashboard/dist, which the server embeds; commit the result.
dashboard:
	@cd web/dashboard && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }
	cd web/dashboard && node build.mjs

.PHONY: build test up bench

# build builds the server/CLI and the static in-sandbox daemon.
build: envd
	go build -trimpath -o bin/agentbox ./cmd/agentbox

# test is what CI runs: generated code and go.mod up to date, vet,
# formatting, then every test (unit and end-to-end, which start the real
# server, and the outside-attack suite e2e/outside; root-only tests fail
# instead of skipping). Last it prints the SDK matrix: which official SDK
# versions drove the real server, and whether their suites passed.
test: check-generated
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@mkdir -p bin && rm -f bin/sdk-matrix.txt
	AGENTBOX_REQUIRE_ROOT=1 AGENTBOX_SDK_MATRIX=$(CURDIR)/bin/sdk-matrix.txt go test -count=1 -timeout 60m ./...; \
	rc=$$?; $(MAKE) --no-print-directory sdk-matrix; exit $$rc

.PHONY: sdk-matrix

# sdk-matrix prints the table the last `make test` collected.
sdk-matrix:
	@echo "SDK matrix (official SDKs against the real server):"
	@printf '  %-22s %-9s %-6s %s\n' SDK VERSION RESULT TEST
	@if [ -s bin/sdk-matrix.txt ]; then sort bin/sdk-matrix.txt | awk '{ printf "  %-22s %-9s %-6s %s\n", $$1, $$2, $$4, $$3 }'; \
	else echo "  (no SDK suite ran)"; fi

# up installs what is missing, builds and runs the server in the foreground.
up:
	bash scripts/up.sh

# bench prints every issue-14 figure next to its raw floor in one table
# (as root). It starts a server of its own from the binaries it builds and
# removes it after; BENCH_API_URL and BENCH_API_KEY measure an existing
# server instead (with BENCH_FLAGS naming its --data-dir, --instance,
# --bridge, --metrics-url). BENCH_DENSITY is the container,gVisor count of
# idle sandboxes held at once (issue 14: 1000,300); BENCH_FLAGS adds any
# other flag of `go run ./bench --help`.
BENCH_DENSITY ?= 1000,300
bench: build
	@# the large-file rows drive the official e2b SDK from e2e/js's pinned packages
	@cd e2e/js && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }
	go run ./bench --scenario all --api-url "$(BENCH_API_URL)" --api-key "$(BENCH_API_KEY)" --all-density $(BENCH_DENSITY) $(BENCH_FLAGS)
