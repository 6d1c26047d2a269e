package benchmark

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// stepTotals reads the server's create step histograms from /metrics:
// seconds and count per step of the plain create path.
type stepTotals map[string]struct {
	sum   float64
	count float64
}

// scrapeSteps reads url (the server's /metrics) with token.
func scrapeSteps(ctx context.Context, url, token string) (stepTotals, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return parseSteps(resp.Body)
}

// parseSteps picks agentbox_sandbox_start_step_seconds_{sum,count} of
// path "create" out of the Prometheus text format.
func parseSteps(r io.Reader) (stepTotals, error) {
	out := stepTotals{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "agentbox_sandbox_start_step_seconds_")
		if !ok {
			continue
		}
		kind, labels, ok := strings.Cut(rest, "{")
		if !ok || (kind != "sum" && kind != "count") || !strings.Contains(labels, `path="create"`) {
			continue
		}
		_, after, ok := strings.Cut(labels, `step="`)
		if !ok {
			continue
		}
		step, after, _ := strings.Cut(after, `"`)
		_, val, ok := strings.Cut(after, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		e := out[step]
		if kind == "sum" {
			e.sum = v
		} else {
			e.count = v
		}
		out[step] = e
	}
	return out, sc.Err()
}

// stepRows is the mean time per create step between two scrapes, slowest
// first.
func stepRows(before, after stepTotals) []row {
	type mean struct {
		step string
		d    time.Duration
	}
	var means []mean
	for step, a := range after {
		b := before[step]
		if n := a.count - b.count; n > 0 {
			means = append(means, mean{step, time.Duration((a.sum - b.sum) / n * float64(time.Second))})
		}
	}
	slices.SortFunc(means, func(x, y mean) int { return int(y.d - x.d) })
	var rows []row
	for _, m := range means {
		rows = append(rows, row{"  create step: " + m.step + " (mean)", m.d.Round(10 * time.Microsecond).String(), "", ""})
	}
	return rows
}
