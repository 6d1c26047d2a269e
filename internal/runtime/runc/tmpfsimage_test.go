package runc

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// maskedDirs are the sandbox's masked directories: runc covers each with an
// empty read-only tmpfs.
var maskedDirs = []string{"/proc/acpi", "/sys/firmware", "/sys/kernel"}

// tmpfsImage is the kind of archive of one tmpfs mount in a CRIU image.
type tmpfsImage int

const (
	tmpfsGzip  tmpfsImage = iota // tar | gzip: stock CRIU, and earlier images
	tmpfsPlain                   // a plain tar (scripts/criu-tmpfs-plain.patch)
	tmpfsEmpty                   // an empty archive standing for an empty read-only tmpfs
)

func (k tmpfsImage) String() string {
	return [...]string{"gzip", "plain", "empty"}[k]
}

// tmpfsImages reads the kind of every tmpfs archive of image img.
func tmpfsImages(t *testing.T, img string) map[string]tmpfsImage {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(img, "tmpfs-*.img"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no tmpfs archives in %s (%v)", img, err)
	}
	kinds := map[string]tmpfsImage{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
			kinds[f] = tmpfsGzip
		case len(b) >= 512 && bytes.Count(b, []byte{0}) == len(b):
			kinds[f] = tmpfsEmpty
		default:
			kinds[f] = tmpfsPlain
		}
	}
	return kinds
}

// gzipInPlace compresses file f as an earlier CRIU wrote its tmpfs archives.
func gzipInPlace(t *testing.T, f string) {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, buf.Bytes(), 0o640); err != nil {
		t.Fatal(err)
	}
}

// sandboxPid is the pid of the running sandbox's init.
func sandboxPid(t *testing.T, e *env, id string) int {
	t.Helper()
	pid, err := bundle.ReadPid(bundle.PidFile(e.b.Dir(id)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// writeInSandbox writes file path with content from inside the sandbox,
// as its root (host root is not mapped in its user namespace, whose tmpfs
// refuses files of unmapped owners).
func writeInSandbox(t *testing.T, e *env, id, path, content string) {
	t.Helper()
	cmd := exec.Command("runc", "--root", e.runcRoot, "exec", e.rc.CID(id), "/bin/sh", "-c", `printf %s "$1" > "$2"`, "sh", content, path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write %s in sandbox %s: %v: %s", path, id, err, out)
	}
}

// assertMasks checks that each masked directory of the sandbox whose init
// is pid is still a read-only tmpfs, and empty.
func assertMasks(t *testing.T, pid int, when string) {
	t.Helper()
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range maskedDirs {
		found := false
		for line := range strings.SplitSeq(string(mi), "\n") {
			f := strings.Fields(line)
			sep := -1
			for i, s := range f {
				if s == "-" {
					sep = i
					break
				}
			}
			if len(f) < 6 || f[4] != dir || sep < 0 || sep+1 >= len(f) {
				continue
			}
			found = true
			if f[sep+1] != "tmpfs" || !strings.HasPrefix(f[5], "ro") {
				t.Errorf("%s: %s is %q (options %s), want a read-only tmpfs", when, dir, f[sep+1], f[5])
			}
		}
		if !found {
			t.Errorf("%s: %s is not masked (no mount there)", when, dir)
			continue
		}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/root%s", pid, dir))
		if err != nil || len(ents) != 0 {
			t.Errorf("%s: %s holds %d entries (%v), want none", when, dir, len(ents), err)
		}
	}
}

// TestTmpfsArchives checks CRIU's handling of the sandbox's tmpfs mounts
// with scripts/criu-tmpfs-plain.patch: the empty read-only masks are dumped
// as empty archives (no tar on either side), the others as plain tar (no
// gzip), files in /dev/shm survive a pause, the masks come back masked, and
// an image whose archives are gzip'd (an earlier CRIU's) still restores.
func TestTmpfsArchives(t *testing.T) {
	e := setup(t, true)
	requireCRIU(t, e)
	ctx := context.Background()
	e.useCounterInit(t)
	const id = "tmpfsimg"
	ep := e.sandbox(t, id, runtime.Resources{MemoryMB: 256})
	count(t, ep)

	pid := sandboxPid(t, e, id)
	assertMasks(t, pid, "before")
	const marker = "kept across a pause\n"
	writeInSandbox(t, e, id, "/dev/shm/marker", marker)

	for _, tc := range []struct {
		name string
		// old rewrites the image as an earlier CRIU would have written it.
		old bool
	}{
		{name: "plain"},
		{name: "gzip archives of an earlier CRIU", old: true},
	} {
		if err := e.rt.Checkpoint(ctx, id, runtime.CheckpointOptions{}); err != nil {
			t.Fatalf("%s: checkpoint: %v", tc.name, err)
		}
		img := filepath.Join(e.b.Dir(id), bundle.CheckpointDir)
		kinds := tmpfsImages(t, img)
		var empty, gz int
		for _, k := range kinds {
			switch k {
			case tmpfsEmpty:
				empty++
			case tmpfsGzip:
				gz++
			}
		}
		if gz == len(kinds) {
			msg := fmt.Sprintf("CRIU (%s) predates scripts/criu-tmpfs-plain.patch: every tmpfs archive is gzip'd; rebuild it with scripts/install-deps.sh", e.rc.criuOnce.path)
			if os.Getenv("AGENTBOX_REQUIRE_ROOT") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		if gz != 0 || empty < len(maskedDirs) {
			t.Fatalf("%s: tmpfs archives %v: want no gzip and an empty archive for each of the %d masks", tc.name, kinds, len(maskedDirs))
		}
		if tc.old {
			for f := range kinds {
				gzipInPlace(t, f)
			}
		}
		if err := e.rt.Restore(ctx, runtime.Spec{ID: id}, runtime.RestoreOptions{}); err != nil {
			t.Fatalf("%s: restore: %v", tc.name, err)
		}
		if err := e.rt.DropCheckpoint(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := get(t, ep, "read?p=/dev/shm/marker"); got != marker {
			t.Fatalf("%s: /dev/shm/marker after restore = %q, want %q", tc.name, got, marker)
		}
		pid = sandboxPid(t, e, id)
		assertMasks(t, pid, tc.name+": after restore")
		count(t, ep)
	}
}
