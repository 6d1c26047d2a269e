package runc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A sandbox's mountinfo: runc's directory masks (read-only tmpfs), its file
// masks (/dev/null binds), a writable tmpfs at a masked path, and, after a
// restore, a mask bound from the view's tmpfs.
const masksMountinfo = `106 56 0:39 / / rw,relatime - overlay overlay rw,lowerdir=/proc/self/fd/19
108 106 0:51 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
110 106 0:52 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,uid=100000,gid=100000
112 110 0:54 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=262144k
61 108 0:57 / /proc/acpi ro,relatime - tmpfs tmpfs ro,uid=100000,gid=100000
62 108 0:6 /null /proc/keys rw,relatime - devtmpfs devtmpfs rw,size=12334460k
65 114 0:58 / /sys/firmware ro,relatime - tmpfs tmpfs ro,uid=100000,gid=100000
67 114 0:50 / /sys/kernel ro,relatime shared:3 - tmpfs tmpfs ro,size=4k,nr_inodes=1,mode=555
70 114 0:59 / /sys/devices/virtual/powercap rw,relatime - tmpfs tmpfs rw
71 114 0:60 / /sys/not/masked ro,relatime - tmpfs tmpfs ro
`

func TestDirMasks(t *testing.T) {
	masked := []string{"/proc/acpi", "/proc/keys", "/sys/firmware", "/sys/kernel", "/sys/devices/virtual/powercap", "/proc/asound"}
	tests := []struct {
		name      string
		mountinfo string
		masked    []string
		want      []string
	}{
		{"runc's and restored masks", masksMountinfo, masked, []string{"/proc/acpi", "/sys/firmware", "/sys/kernel"}},
		{"no masked paths", masksMountinfo, nil, nil},
		{"empty mountinfo", "", masked, nil},
		{"garbage", "no separator here\n1 2 3 - tmpfs\n", masked, nil},
		{"path CRIU's options cannot carry", "61 108 0:57 / /proc/a]b ro,relatime - tmpfs tmpfs ro\n", []string{"/proc/a]b"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := dirMasks([]byte(tt.mountinfo), tt.masked); !slices.Equal(got, tt.want) {
				t.Errorf("dirMasks = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestValidMaskPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/proc/acpi": true, "/sys/devices/virtual/powercap": true, "/a_b.c-d": true,
		"": false, "/": false, "proc/acpi": false, "/proc/../etc": false, "/proc/acpi/": false,
		"/a b": false, "/a:b": false, "/a]b": false, "/a[b": false, "/a\nb": false,
	} {
		if got := validMaskPath(p); got != want {
			t.Errorf("validMaskPath(%q) = %v, want %v", p, got, want)
		}
	}
}

// The masks an image lists come back as CRIU options only when the image
// lists any; a listed mask that is not a plain path fails the restore
// rather than reaching CRIU's options.
func TestMaskRestoreConfWithoutList(t *testing.T) {
	img := t.TempDir()
	conf, err := maskRestoreConf(t.TempDir(), img)
	if err != nil || conf != nil {
		t.Fatalf("image without a list: %q, %v; want no options", conf, err)
	}
	if err := writeMasks(img, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(img, criuMasks)); !os.IsNotExist(err) {
		t.Fatalf("no masks wrote a list: %v", err)
	}
	if err := os.WriteFile(filepath.Join(img, criuMasks), []byte("/proc/acpi\n/x]y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := maskRestoreConf(t.TempDir(), img); err == nil {
		t.Fatal("a bundle without a view, or a malformed list, restored")
	}
}

func TestMaskKey(t *testing.T) {
	if got, want := maskKey("/sys/kernel"), "agentbox-mask-sys-kernel"; got != want {
		t.Errorf("maskKey = %q, want %q", got, want)
	}
}
