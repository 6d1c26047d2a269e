package untar

import "testing"

func TestLimitsOr(t *testing.T) {
	d := Limits{MaxBytes: 10, MaxEntryBytes: 5, MaxEntries: 3, MaxRatio: 100, RatioGrace: 64, MaxPathBytes: 4096, MaxPathDepth: 256, MaxXattrBytes: 1024}
	for _, tc := range []struct {
		name string
		l    Limits
		want Limits
	}{
		{"zero takes every default", Limits{}, d},
		{"set fields stay", Limits{MaxBytes: 7, MaxEntries: 9, MaxRatio: 2}, Limits{MaxBytes: 7, MaxEntryBytes: 5, MaxEntries: 9, MaxRatio: 2, RatioGrace: 64, MaxPathBytes: 4096, MaxPathDepth: 256, MaxXattrBytes: 1024}},
		{"negative takes the default", Limits{MaxBytes: -1, MaxPathDepth: -3}, d},
		{"every field set", Limits{1, 2, 3, 4, 5, 6, 7, 8}, Limits{1, 2, 3, 4, 5, 6, 7, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.Or(d); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestLimitsFileSize(t *testing.T) {
	for _, tc := range []struct {
		l    Limits
		want int64
	}{
		{Limits{}, 0},
		{Limits{MaxBytes: 10}, 10},
		{Limits{MaxEntryBytes: 4}, 4},
		{Limits{MaxBytes: 10, MaxEntryBytes: 4}, 4},
		{Limits{MaxBytes: 3, MaxEntryBytes: 4}, 3},
	} {
		if got := tc.l.FileSize(); got != tc.want {
			t.Errorf("%+v: FileSize %d, want %d", tc.l, got, tc.want)
		}
	}
}
