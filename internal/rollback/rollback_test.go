package rollback

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestRunUndoesNewestFirstAndKeepsGoing(t *testing.T) {
	var l List
	var ran []string
	for _, name := range []string{"network", "container", "record"} {
		l.Add(name, func(context.Context) error {
			ran = append(ran, name)
			if name == "container" {
				return errors.New("busy")
			}
			return nil
		})
	}
	err := l.Run(context.Background())
	if want := []string{"record", "container", "network"}; !slices.Equal(ran, want) {
		t.Fatalf("undo order %v, want %v", ran, want)
	}
	if err == nil || !strings.Contains(err.Error(), "undo container: busy") {
		t.Fatalf("err = %v; want the failed undo named", err)
	}
	if len(l.Names()) != 0 {
		t.Fatalf("list not emptied: %v", l.Names())
	}
	if err := l.Run(context.Background()); err != nil {
		t.Fatalf("second run: %v", err)
	}
	if len(ran) != 3 {
		t.Fatalf("undos ran twice: %v", ran)
	}
}

func TestReleaseKeepsWhatWasMade(t *testing.T) {
	var l List
	l.Add("network", func(context.Context) error { t.Fatal("released undo ran"); return nil })
	l.Release()
	if err := l.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
