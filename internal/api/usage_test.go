package api

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/usage"
)

func TestUsageWindow(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for _, tc := range []struct {
		query, errField string
		from, to        time.Time
	}{
		{query: "", from: now.Add(-defaultUsageWindow), to: now},
		{query: "from=2026-03-01T00:00:00Z", from: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), to: now},
		{query: "from=2026-03-01T00:00:00%2B02:00&to=2026-03-02T00:00:00Z", from: time.Date(2026, 2, 28, 22, 0, 0, 0, time.UTC), to: time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
		{query: "to=2026-03-01T00:00:00Z", from: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Add(-defaultUsageWindow), to: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		{query: "from=yesterday", errField: "from:"},
		{query: "to=1700000000", errField: "to:"},
		{query: "from=2026-03-02T00:00:00Z&to=2026-03-01T00:00:00Z", errField: "from:"},
	} {
		q, _ := url.ParseQuery(tc.query)
		from, to, err := usageWindow(q, now)
		if tc.errField != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.errField) {
				t.Errorf("%q: err %v, want one naming %s", tc.query, err, tc.errField)
			}
			continue
		}
		if err != nil || !from.Equal(tc.from) || !to.Equal(tc.to) {
			t.Errorf("%q: %v %v %v, want %v %v", tc.query, from, to, err, tc.from, tc.to)
		}
	}
}

func TestUsageResponseSplitsSnapshots(t *testing.T) {
	rows := []usage.Row{
		{Key: usage.Key{Kind: usage.KindSandbox, ID: "s1"}, TemplateID: "base", Amount: usage.Amount{CPUSeconds: 2, MemoryGiBSeconds: 3, DiskGiBHours: 1, EgressBytes: 7}},
		{Key: usage.Key{Kind: usage.KindSnapshot, ID: "snap"}, Amount: usage.Amount{DiskGiBHours: 5}},
	}
	got := usageResponse("t", time.Time{}, time.Time{}, rows)
	if len(got.Sandboxes) != 1 || got.Sandboxes[0].SandboxID != "s1" || got.Sandboxes[0].TemplateID != "base" {
		t.Fatalf("sandboxes %+v, want s1 only", got.Sandboxes)
	}
	if got.Totals.CPUSeconds != 2 || got.Totals.DiskGiBHours != 1 || got.Totals.SnapshotGiBHours != 5 || got.Totals.EgressBytes != 7 {
		t.Errorf("totals %+v", got.Totals)
	}
	if empty := usageResponse("t", time.Time{}, time.Time{}, nil); empty.Sandboxes == nil {
		t.Error("no rows: sandboxes must be [] on the wire, not null")
	}
}
