package kube

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// apiCounts is the API server's apiserver_request_total summed by verb and
// resource[/subresource]: what every client asked of it so far.
type apiCounts map[string]float64

// scrapeRequests reads the API server's request counters from /metrics.
func scrapeRequests(ctx context.Context, t *testing.T, kcPath string) apiCounts {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kcPath)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("read the API server's /metrics: %v", err)
	}
	out, err := parseRequestTotals(raw)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parseRequestTotals sums the apiserver_request_total samples of a
// Prometheus text exposition by "VERB resource[/subresource]".
func parseRequestTotals(raw []byte) (apiCounts, error) {
	out := apiCounts{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<22)
	// Besides the counts, the seconds the API server spent answering
	// (queueing and storage included), and the seconds etcd took it.
	const (
		name     = "apiserver_request_total{"
		seconds  = "apiserver_request_duration_seconds_sum{"
		etcdTime = "etcd_request_duration_seconds_sum{"
	)
	for sc.Scan() {
		line := sc.Text()
		var prefix string
		for _, p := range []string{name, seconds, etcdTime} {
			if strings.HasPrefix(line, p) {
				prefix = p
			}
		}
		if prefix == "" {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("metrics line %q: no closing brace", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		lbl := map[string]string{}
		for kv := range strings.SplitSeq(line[len(prefix):end], ",") {
			k, val, ok := strings.Cut(kv, "=")
			if ok {
				lbl[k] = strings.Trim(val, `"`)
			}
		}
		switch prefix {
		case etcdTime:
			out[secPrefix+"etcd "+lbl["operation"]+" "+lbl["type"]] += v
			continue
		case seconds:
			if lbl["verb"] == "WATCH" || lbl["verb"] == "CONNECT" {
				continue // lasts as long as the client stays
			}
			out[secPrefix+lbl["verb"]+" "+lbl["resource"]+"/"+lbl["subresource"]] += v
			continue
		}
		key := lbl["verb"] + " " + lbl["resource"]
		if s := lbl["subresource"]; s != "" {
			key += "/" + s
		}
		out[key] += v
	}
	return out, sc.Err()
}

// perClaim is what changed from before to after, per claim, largest first;
// writes are the POST, PUT, PATCH and DELETE requests.
func (after apiCounts) perClaim(before apiCounts, n int) (lines []string, total, writes float64) {
	type row struct {
		key string
		v   float64
	}
	var rows []row
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if strings.HasPrefix(k, secPrefix) {
			continue
		}
		d := after[k] - before[k]
		if d <= 0 {
			continue
		}
		rows = append(rows, row{k, d / float64(n)})
		total += d / float64(n)
		switch verb, _, _ := strings.Cut(k, " "); verb {
		case "POST", "PUT", "PATCH", "DELETE":
			writes += d / float64(n)
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		switch {
		case a.v > b.v:
			return -1
		case a.v < b.v:
			return 1
		}
		return 0
	})
	for _, r := range rows {
		if r.v >= 0.01 {
			lines = append(lines, fmt.Sprintf("%6.2f %s", r.v, r.key))
		}
	}
	return lines, total, writes
}

// secPrefix marks the keys of seconds spent, not requests.
const secPrefix = "sec "

// timeSpent is the API server's and etcd's seconds from before to after by
// verb and resource (etcd: operation and type), largest first, with the
// API server's total (etcd's overlaps it).
func (after apiCounts) timeSpent(before apiCounts) (lines []string, total float64) {
	type row struct {
		key string
		v   float64
	}
	var rows []row
	for k, v := range after {
		if d := v - before[k]; strings.HasPrefix(k, secPrefix) && d > 0 {
			rows = append(rows, row{strings.TrimPrefix(k, secPrefix), d})
			if !strings.HasPrefix(k, secPrefix+"etcd ") {
				total += d
			}
		}
	}
	slices.SortFunc(rows, func(a, b row) int {
		switch {
		case a.v > b.v:
			return -1
		case a.v < b.v:
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	for _, r := range rows[:min(len(rows), 12)] {
		lines = append(lines, fmt.Sprintf("%8.1fs %s", r.v, r.key))
	}
	return lines, total
}

func TestParseRequestTotals(t *testing.T) {
	raw := []byte(`# HELP apiserver_request_total [STABLE] Counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 1000
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="agents.x-k8s.io",resource="sandboxes",scope="resource",subresource="status",verb="PUT",version="v1beta1"} 7
apiserver_request_duration_seconds_bucket{verb="POST",le="1"} 9
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 2.5
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="WATCH",version="v1"} 99
etcd_request_duration_seconds_sum{operation="create",type="/registry/configmaps"} 1.5
`)
	got, err := parseRequestTotals(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := apiCounts{"POST configmaps": 1003, "PUT sandboxes/status": 7, "sec POST configmaps/": 2.5, "sec etcd create /registry/configmaps": 1.5}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	lines, total, writes := got.perClaim(apiCounts{"POST configmaps": 3}, 10)
	if math.Abs(total-100.7) > 1e-9 || math.Abs(writes-100.7) > 1e-9 || len(lines) != 2 || !strings.HasSuffix(lines[0], "POST configmaps") {
		t.Fatalf("perClaim: %v %v %v", lines, total, writes)
	}
	spent, secs := got.timeSpent(apiCounts{})
	if secs != 2.5 || len(spent) != 2 || !strings.HasSuffix(spent[0], "POST configmaps/") {
		t.Fatalf("timeSpent: %v %v", spent, secs)
	}
}
