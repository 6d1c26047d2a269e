#!/bin/sh
# Network scenario (root): egress proxy overhead per request against the
# same request without the proxy, and the gateway's added latency and
# throughput against a direct connection. Both run in-process against a fake
# internet / loopback upstream, so they need no running server.
#
#   sudo sh bench/network.sh            # about 1 minute
set -e
cd "$(dirname "$0")/.."
echo "== egress proxy: new connection per request (p50-µs = median request time)"
go test -count=1 -run '^$' -bench BenchmarkEgress -benchtime "${EGRESS_N:-500}x" ./internal/egress | grep -E '^Benchmark'
echo "== gateway: keep-alive small request (p50-µs) and 8 MiB download (MB/s)"
go test -count=1 -run '^$' -bench BenchmarkGateway -benchtime "${GATEWAY_N:-1000}x" ./internal/gateway | grep -E '^Benchmark'
