package sandbox

import (
	"context"
	"errors"
	goruntime "runtime"
	"testing"
)

func TestCreateSlots(t *testing.T) {
	for _, tc := range []struct{ procs, want int }{{0, 2}, {1, 2}, {2, 4}, {16, 32}} {
		if got := createSlots(tc.procs); got != tc.want {
			t.Errorf("createSlots(%d) = %d, want %d", tc.procs, got, tc.want)
		}
	}
}

func TestCreateSlot(t *testing.T) {
	a := &admission{}
	rel, err := a.createSlot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if got, want := cap(a.createSlots), createSlots(goruntime.GOMAXPROCS(0)); got != want {
		t.Fatalf("%d slots, want %d", got, want)
	}

	a.createSlots = make(chan struct{}, 2)
	var held []func()
	for range 2 {
		rel, err := a.createSlot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, rel)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.createSlot(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("all slots taken, context cancelled: err = %v, want context.Canceled", err)
	}
	held[0]() // one create finishes
	rel, err = a.createSlot(context.Background())
	if err != nil {
		t.Fatalf("the freed slot: %v", err)
	}
	rel()
	held[1]()
}
