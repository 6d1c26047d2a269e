package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
)

type oneTemplate struct{ tpl template.Template }

func (o oneTemplate) Get(_ context.Context, _, ref string) (*template.Template, error) {
	if ref != o.tpl.ID {
		return nil, errdefs.ErrNotFound
	}
	t := o.tpl
	return &t, nil
}

// quotaManager is a manager with a real store and no runtime or network:
// enough for everything a create decides before it touches the host.
func quotaManager(t *testing.T) (*Manager, *store.Store) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpl := oneTemplate{template.Template{ID: "base", CPUCount: 1, MemoryMB: 512, DiskMB: 1024}}
	m, err := New(ctx, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Store: st, Templates: tpl})
	if err != nil {
		t.Fatal(err)
	}
	return m, st
}

func TestTeamQuotaOverridesServerPerField(t *testing.T) {
	ctx := context.Background()
	m, st := quotaManager(t)
	team, _ := st.EnsureTeam(ctx, "small")
	if q, err := m.admission.teamQuota(ctx, team.ID); err != nil || q != DefaultQuota() {
		t.Fatalf("no team quota: %+v, %v; want the server's", q, err)
	}
	if err := st.SetTeamQuota(ctx, team.ID, store.TeamQuota{MemoryMB: 256, MaxSandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	want := DefaultQuota()
	want.MemoryMB, want.MaxSandboxes = 256, 2
	if q, err := m.admission.teamQuota(ctx, team.ID); err != nil || q != want {
		t.Fatalf("team quota = %+v, %v; want %+v", q, err, want)
	}
}

func TestTeamQuotaChecks(t *testing.T) {
	ctx := context.Background()
	m, st := quotaManager(t)
	small, _ := st.EnsureTeam(ctx, "small")
	big, _ := st.EnsureTeam(ctx, "big")
	if err := st.SetTeamQuota(ctx, small.ID, store.TeamQuota{MemoryMB: 256, CPUCount: 1, MaxSandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	// Two sandboxes of the small team exist already: one running, one paused.
	// A killing one and another team's do not count.
	m.sandboxes["a"] = &Sandbox{ID: "a", TeamID: small.ID, State: StateRunning}
	m.sandboxes["b"] = &Sandbox{ID: "b", TeamID: small.ID, State: StatePaused}
	m.sandboxes["c"] = &Sandbox{ID: "c", TeamID: small.ID, State: StateKilling}
	m.sandboxes["d"] = &Sandbox{ID: "d", TeamID: big.ID, State: StateRunning}

	tests := []struct {
		name    string
		team    string
		limits  Limits
		drop    string // sandbox removed before the create
		want    error
		wantMsg string
	}{
		{"at maxSandboxes", small.ID, Limits{MemoryMB: 128}, "", errdefs.ErrResourceExhausted, "already has 2 sandbox(es) running, paused or starting, and its quota allows 2"},
		{"template default over the team's memory", small.ID, Limits{}, "a", errdefs.ErrInvalidArgument, "memoryMB: 512 MiB is over the team quota of 256 MiB"},
		{"ask over the team's cpu", small.ID, Limits{CPUCount: 2, MemoryMB: 128}, "a", errdefs.ErrInvalidArgument, "cpuCount: 2 CPUs is over the team quota of 1"},
		{"other team keeps the server's quota", big.ID, Limits{MemoryMB: 4096, CPUCount: 4}, "", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.drop != "" {
				delete(m.sandboxes, tt.drop)
			}
			// The two checks Create makes before any host setup (this
			// manager has no network or runtime to go further).
			q, err := m.admission.teamQuota(ctx, tt.team)
			if err != nil {
				t.Fatal(err)
			}
			release, err := m.admission.reserveSandbox(tt.team, q)
			if err == nil {
				defer release()
				tpl, _ := m.templates.Get(ctx, tt.team, "base")
				_, err = resolveLimits(tt.limits, tpl, q)
			}
			if tt.want == nil {
				if err != nil {
					t.Fatalf("err = %v, want none", err)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.want, tt.wantMsg)
			}
		})
	}
}

func TestCreateRefusedAtMaxSandboxes(t *testing.T) {
	ctx := context.Background()
	m, st := quotaManager(t)
	team, _ := st.EnsureTeam(ctx, "small")
	if err := st.SetTeamQuota(ctx, team.ID, store.TeamQuota{MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	m.sandboxes["a"] = &Sandbox{ID: "a", TeamID: team.ID, State: StatePaused}
	_, err := m.Create(ctx, CreateRequest{TeamID: team.ID, Template: "base", Timeout: time.Minute})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "kill one") {
		t.Fatalf("Create = %v, want ErrResourceExhausted saying how to free room", err)
	}
	// The refusal does not leave a reservation behind.
	if n := m.admission.reserved[team.ID]; n != 0 {
		t.Fatalf("reserved = %d after a refusal", n)
	}
	// An operator's change applies to the next create, no restart needed.
	if err := st.ClearTeamQuota(ctx, team.ID); err != nil {
		t.Fatal(err)
	}
	_, err = m.Create(ctx, CreateRequest{TeamID: team.ID, Template: "base", Timeout: time.Minute, Limits: Limits{MemoryMB: 1 << 20}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "team quota of 16384") {
		t.Fatalf("Create after clear = %v, want the server's memory quota", err)
	}
}

// Reservations count creates in flight, so concurrent creates cannot all
// slip under the cap; releasing twice frees one slot only.
func TestReserveSandboxCountsInFlight(t *testing.T) {
	m, _ := quotaManager(t)
	q := Quota{MaxSandboxes: 2}
	r1, err := m.admission.reserveSandbox("t", q)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := m.admission.reserveSandbox("t", q)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.admission.reserveSandbox("t", q); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third reservation = %v, want ErrResourceExhausted", err)
	}
	if _, err := m.admission.reserveSandbox("other", q); err != nil {
		t.Fatalf("another team: %v", err)
	}
	r1()
	r1()
	if _, err := m.admission.reserveSandbox("t", q); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := m.admission.reserveSandbox("t", q); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("double release freed two slots: %v", err)
	}
	r2()
	if _, err := m.admission.reserveSandbox(poolTeam, Quota{MaxSandboxes: 1}); err != nil {
		t.Fatalf("warm pool is not capped: %v", err)
	}
}

// TestServerDefaultsFollowTheQuota: a team quota below a server default
// (pids) lowers the default a create gets; only a value the create
// asked for past the quota is refused.
func TestServerDefaultsFollowTheQuota(t *testing.T) {
	tpl := &template.Template{MemoryMB: 512}
	q := Quota{Limits: Limits{PIDs: 512}}
	got, err := resolveLimits(Limits{}, tpl, q)
	if err != nil || got.PIDs != 512 {
		t.Fatalf("defaults under a small quota: %+v %v, want pids 512", got, err)
	}
	if _, err := resolveLimits(Limits{PIDs: 1024}, tpl, q); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "pids: 1024") {
		t.Fatalf("asking for pids over the quota: %v, want a refusal naming pids", err)
	}
}
