package api

import (
	"encoding/json"
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

// TestUsageWireJSON pins the bytes of GET /usage: the dashboard parses them.
func TestUsageWireJSON(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	rows := []usage.Row{{Key: usage.Key{Kind: usage.KindSandbox, ID: "i1"}, TemplateID: "tpl1",
		Amount: usage.Amount{CPUSeconds: 1.5, MemoryGiBSeconds: 2.25, DiskGiBHours: 0.5, EgressBytes: 1024}}}
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"usage", usageResponse("team-a", t0, t0.Add(time.Hour), rows),
			`{"teamID":"team-a","from":"2026-03-04T05:00:00Z","to":"2026-03-04T06:00:00Z","totals":{"cpuSeconds":1.5,"memoryGiBSeconds":2.25,"diskGiBHours":0.5,"snapshotGiBHours":0,"egressBytes":1024},"sandboxes":[{"sandboxID":"i1","templateID":"tpl1","cpuSeconds":1.5,"memoryGiBSeconds":2.25,"diskGiBHours":0.5,"egressBytes":1024}]}`},
		{"no usage", usageResponse("team-a", t0, t0, nil),
			`{"teamID":"team-a","from":"2026-03-04T05:00:00Z","to":"2026-03-04T05:00:00Z","totals":{"cpuSeconds":0,"memoryGiBSeconds":0,"diskGiBHours":0,"snapshotGiBHours":0,"egressBytes":0},"sandboxes":[]}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, b, tc.want)
		}
	}
}
