GOBIN ?= $(shell go env GOPATH)/bin
BUF_VERSION ?= v1.75.0

.PHONY: generate envd tools

# generate regenerates the protobuf and Connect code under api/gen.
generate: tools
	cd api && PATH="$(GOBIN):$$PATH" buf generate

tools:
	@test -x $(GOBIN)/buf || go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@test -x $(GOBIN)/protoc-gen-go || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	@test -x $(GOBIN)/protoc-gen-connect-go || go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1

# envd builds the in-sandbox daemon as a static binary.
envd:
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/envd ./cmd/envd
