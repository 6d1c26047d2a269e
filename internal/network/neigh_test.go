package network

import "testing"

func TestNeighbourThresholds(t *testing.T) {
	tests := []struct {
		name              string
		hosts, cur2, cur3 int
		want2, want3      int
	}{
		{"kernel defaults, a /24: unchanged", 256, 512, 1024, 512, 1024},
		{"kernel defaults, a /22", 1024, 512, 1024, 1280, 2560},
		{"kernel defaults, the default /16", 65536, 512, 1024, 65792, 131584},
		{"already higher: never lowered", 1024, 4096, 8192, 4096, 8192},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g2, g3 := neighbourThresholds(tt.hosts, tt.cur2, tt.cur3)
			if g2 != tt.want2 || g3 != tt.want3 {
				t.Errorf("got %d, %d; want %d, %d", g2, g3, tt.want2, tt.want3)
			}
			if g2 > g3 || g3 < tt.hosts {
				t.Errorf("thresholds %d, %d do not fit %d hosts", g2, g3, tt.hosts)
			}
		})
	}
}
