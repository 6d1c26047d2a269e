package audit

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

func newLog(t *testing.T) (*Log, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st), st
}

func TestAppendQuery(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	events := []Event{
		{SandboxID: "a", TeamID: "t1", Kind: KindLifecycle, Action: "create"},
		{SandboxID: "a", TeamID: "t1", APIKeyID: "k1", Kind: KindProcess, Action: "start", Fields: map[string]any{"cmd": "/bin/bash", "args": []any{"-c", "ls"}}},
		{SandboxID: "b", TeamID: "t2", Kind: KindFile, Action: "write", Fields: map[string]any{"path": "/x"}},
		{SandboxID: "a", TeamID: "t1", Kind: KindLimit, Action: "oom", Decision: Denied, Reason: "memory limit"},
	}
	for _, e := range events {
		if err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		q    Query
		want []string // actions
	}{
		{"all", Query{}, []string{"create", "start", "write", "oom"}},
		{"sandbox", Query{SandboxID: "a"}, []string{"create", "start", "oom"}},
		{"team", Query{TeamID: "t2"}, []string{"write"}},
		{"kinds", Query{SandboxID: "a", Kinds: []string{KindProcess, KindLimit}}, []string{"start", "oom"}},
		{"limit keeps newest", Query{SandboxID: "a", Limit: 2}, []string{"start", "oom"}},
		{"after", Query{AfterSeq: 2}, []string{"write", "oom"}},
		{"since future", Query{Since: time.Now().Add(time.Hour)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := l.Query(ctx, tt.q)
			if err != nil {
				t.Fatal(err)
			}
			var acts []string
			for _, e := range got {
				acts = append(acts, e.Action)
			}
			if len(acts) != len(tt.want) {
				t.Fatalf("got %v, want %v", acts, tt.want)
			}
			for i := range acts {
				if acts[i] != tt.want[i] {
					t.Fatalf("got %v, want %v", acts, tt.want)
				}
			}
		})
	}
	got, _ := l.Query(ctx, Query{Kinds: []string{KindProcess}})
	if got[0].Fields["cmd"] != "/bin/bash" || got[0].APIKeyID != "k1" || got[0].Decision != Info || got[0].Seq == 0 {
		t.Fatalf("round trip lost data: %+v", got[0])
	}
	if _, err := l.Query(ctx, Query{Kinds: []string{"bogus"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown kind: %v", err)
	}
	if err := l.Append(ctx, Event{Kind: "bogus"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("append unknown kind: %v", err)
	}
}

func TestSubscribe(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	chA, cancelA := l.Subscribe("a")
	chAll, cancelAll := l.Subscribe("")
	defer cancelAll()
	l.Append(ctx, Event{SandboxID: "b", Kind: KindFile, Action: "write"})
	l.Append(ctx, Event{SandboxID: "a", Kind: KindProcess, Action: "start"})
	if e := <-chA; e.SandboxID != "a" || e.Action != "start" {
		t.Fatalf("follower of a got %+v", e)
	}
	for _, want := range []string{"b", "a"} {
		if e := <-chAll; e.SandboxID != want {
			t.Fatalf("follower of all got %+v, want sandbox %s", e, want)
		}
	}
	cancelA()
	cancelA() // idempotent
	if _, ok := <-chA; ok {
		t.Fatal("channel still open after cancel")
	}
	l.Append(ctx, Event{SandboxID: "a", Kind: KindProcess, Action: "exit"}) // no send on a closed channel
}
