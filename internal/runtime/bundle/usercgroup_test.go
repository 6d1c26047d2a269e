package bundle

import "testing"

func TestUserLimits(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name              string
		pids, mem         int64
		wantPIDs, wantMem int64
	}{
		{"no limits", 0, 0, 0, 0},
		{"default pids: an eighth kept", 4096, 0, 4096 - 512, 0},
		{"large pids: the most kept", 100000, 0, 100000 - 512, 0},
		{"small pids: the least kept", 256, 0, 256 - 64, 0},
		{"tiny pids: half kept", 16, 0, 8, 0},
		{"128 MiB: the least kept", 0, 128 * mib, 0, 96 * mib},
		{"1 GiB: an eighth kept", 0, 1024 * mib, 0, 896 * mib},
		{"8 GiB: the most kept", 0, 8192 * mib, 0, 7936 * mib},
		{"48 MiB: half kept", 0, 48 * mib, 0, 24 * mib},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, m := UserLimits(c.pids, c.mem)
			if p != c.wantPIDs || m != c.wantMem {
				t.Errorf("UserLimits(%d, %d) = %d, %d; want %d, %d", c.pids, c.mem, p, m, c.wantPIDs, c.wantMem)
			}
		})
	}
}
