package kube

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestMoveCrashSteps(t *testing.T) {
	var got []string
	for _, c := range MoveCrashSteps() {
		got = append(got, c.String())
	}
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s] {
			t.Errorf("crash point %s listed twice in %v", s, got)
		}
		seen[s] = true
	}
	// In the order a move reaches them.
	want := []string{
		"move-out/copy layers", "move-out/export image", "move-out/upload", "move-out/record", "move-out/drop older",
		"node-lost/mark", "move/rebind",
		"move-in/fetch image", "move-in/place image", "restore/persist creating", "restore/register",
		"move-in/restore", "move-in/drop image", "move-in/clear record",
	}
	last := -1
	for _, w := range want {
		i := slices.Index(got, w)
		if i < 0 {
			t.Errorf("crash point %s missing from %v", w, got)
			continue
		}
		if i < last {
			t.Errorf("crash point %s comes before the one listed before it: %v", w, got)
		}
		last = i
	}
}

func TestRunMove(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		fail    string
		wantRan []string
		wantErr error
	}{
		{"all steps run in order", "", []string{"a", "b", "c"}, nil},
		{"a failing step stops the rest", "b", []string{"a", "b"}, boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ran []string
			step := func(name string) moveStep {
				return moveStep{name, func(context.Context) error {
					ran = append(ran, name)
					if name == tt.fail {
						return boom
					}
					return nil
				}}
			}
			err := reconcilerBase{}.runMove(context.Background(), OpMove, []moveStep{step("a"), step("b"), step("c")})
			if !errors.Is(err, tt.wantErr) || !slices.Equal(ran, tt.wantRan) {
				t.Errorf("ran %v, err %v; want %v, %v", ran, err, tt.wantRan, tt.wantErr)
			}
		})
	}
}
