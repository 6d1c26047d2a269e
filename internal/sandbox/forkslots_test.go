package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestForkSlots(t *testing.T) {
	for _, tc := range []struct{ procs, want int }{{0, 4}, {1, 5}, {2, 10}, {16, 80}} {
		if got := forkSlots(tc.procs); got != tc.want {
			t.Errorf("forkSlots(%d) = %d, want %d", tc.procs, got, tc.want)
		}
	}
}

// A fork's copies take fork slots, not create slots: cold creates that
// hold every create slot do not hold up a fork, and the reverse.
func TestForkSlotSeparateFromCreateSlots(t *testing.T) {
	a := &admission{}
	a.createSlots = make(chan struct{}, 1)
	a.forkSlots = make(chan struct{}, 1)
	relCreate, err := a.createSlot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A wait that never ends would hang the test; the bound only ends it.
	wait, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	relFork, err := a.forkSlot(wait)
	if err != nil {
		t.Fatalf("create slots all taken: fork slot: %v, want one", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.forkSlot(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("fork slots all taken, context cancelled: err = %v, want context.Canceled", err)
	}
	relCreate()
	relCreate, err = a.createSlot(wait)
	if err != nil {
		t.Fatalf("fork slots all taken: create slot: %v, want one", err)
	}
	relCreate()
	relFork()
}
