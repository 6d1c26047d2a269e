package sandbox

import (
	"errors"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestResolveCommandLifetime(t *testing.T) {
	m := &starter{cfg: Config{MaxCommandLifetime: time.Hour}}
	for _, tc := range []struct {
		name    string
		req     time.Duration
		want    time.Duration
		wantErr bool
	}{
		{name: "absent takes the server's cap", req: 0, want: time.Hour},
		{name: "lower than the cap", req: time.Minute, want: time.Minute},
		{name: "equal to the cap", req: time.Hour, want: time.Hour},
		{name: "above the cap", req: 2 * time.Hour, wantErr: true},
		{name: "negative", req: -time.Second, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.resolveCommandLifetime(tc.req)
			if tc.wantErr {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want invalid argument", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}
