package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// HostState is what one server instance holds on the host, as named items
// per kind: containers (runc and runsc), mounts, loop devices, cgroups,
// netns pins, veths on its bridge, nftables set elements, files of its
// snapshot, upload and volume dirs, and database rows. Two snapshots taken
// before and after an operation (or a crash and restart) diff to what
// leaked.
type HostState map[string][]string

// Host-state kinds.
const (
	KindContainer = "container"
	KindMount     = "mount"
	KindLoop      = "loop device"
	KindCgroup    = "cgroup"
	KindNetns     = "netns"
	KindVeth      = "veth"
	KindNft       = "nftables element"
	KindFile      = "file"
	KindRow       = "database row"
)

// HostState takes a snapshot of the server's host state. The server may be
// running or stopped; the database is read with the sqlite3 CLI, read-only.
func (s *Server) HostState(ctx context.Context) HostState {
	h := HostState{}
	run := filepath.Join("/run", s.Instance)
	for _, rt := range []struct{ bin, root string }{{"runc", filepath.Join(run, "runc")}, {"runsc", filepath.Join(run, "runc-runsc")}} {
		if _, err := os.Stat(rt.root); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, rt.bin, "--root", rt.root, "list", "--quiet").Output()
		if err != nil {
			h.add(KindContainer, fmt.Sprintf("(%s list: %v)", rt.bin, err))
			continue
		}
		for _, id := range strings.Fields(string(out)) {
			h.add(KindContainer, rt.bin+" "+id)
		}
	}
	for _, dir := range []string{s.DataDir, run} {
		m, err := MountsUnder(dir)
		if err != nil {
			h.add(KindMount, "(mountinfo: "+err.Error()+")")
		}
		for _, p := range m {
			// The gVisor tier's empty netns for restores is host setup,
			// kept for the server's life like its bridge.
			if filepath.Base(p) != "null-netns" {
				h.add(KindMount, p)
			}
		}
	}
	if out, err := exec.CommandContext(ctx, "losetup", "-a").Output(); err == nil {
		for line := range strings.SplitSeq(string(out), "\n") {
			// The disk pool's ready disks (--disk-pool) are the server's
			// own, made for no sandbox yet and replaced as creates take
			// them; one whose file is gone (an earlier run's) is a leak.
			if strings.Contains(line, filepath.Join(s.DataDir, bundle.DiskPoolDirName)+"/") && !strings.Contains(line, "(deleted)") {
				continue
			}
			if strings.Contains(line, s.DataDir) || strings.Contains(line, s.TemplateDir+"/") && strings.Contains(line, s.Instance) {
				h.add(KindLoop, strings.TrimSpace(line))
			}
		}
	}
	for _, ctrl := range []string{"memory", "pids", "cpu", "cpuacct", "freezer", "unified", "systemd", ""} {
		base := filepath.Join("/sys/fs/cgroup", ctrl, s.Instance)
		ents, _ := os.ReadDir(base)
		for _, e := range ents {
			if e.IsDir() {
				h.add(KindCgroup, filepath.Join(base, e.Name()))
			}
		}
	}
	for _, dir := range []string{filepath.Join(run, "netns")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			h.add(KindNetns, filepath.Join(dir, e.Name()))
		}
	}
	if out, err := exec.CommandContext(ctx, "ip", "-o", "link", "show", "master", s.Bridge).Output(); err == nil {
		for line := range strings.SplitSeq(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				h.add(KindVeth, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
			}
		}
	}
	for _, fam := range []string{"inet", "bridge"} {
		out, err := exec.CommandContext(ctx, "nft", "list", "table", fam, s.Instance).Output()
		if err != nil {
			continue // no table: nothing in it
		}
		for _, el := range nftElements(string(out)) {
			h.add(KindNft, fam+" "+el)
		}
	}
	// kube-export stages a node agent's image uploads (tenant memory).
	for _, dir := range []string{"snapshots", "volumes", "uploads", "builds", "sandboxes", "kube-export"} {
		ents, _ := os.ReadDir(filepath.Join(s.DataDir, dir))
		for _, e := range ents {
			h.add(KindFile, filepath.Join(dir, e.Name()))
		}
	}
	db := filepath.Join(s.DataDir, "agentbox.db")
	if _, err := os.Stat(db); err == nil {
		for _, q := range []struct{ table, sql string }{
			{"sandboxes", "SELECT id || ' ' || state FROM sandboxes"},
			{"volumes", "SELECT id FROM volumes"},
		} {
			out, err := exec.CommandContext(ctx, "sqlite3", "-readonly", db, q.sql).Output()
			if err != nil {
				h.add(KindRow, fmt.Sprintf("(%s: %v)", q.table, err))
				continue
			}
			for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
				if line != "" {
					h.add(KindRow, q.table+" "+line)
				}
			}
		}
	}
	for k := range h {
		slices.Sort(h[k])
	}
	return h
}

func (h HostState) add(kind, item string) { h[kind] = append(h[kind], item) }

// nftSetElems matches the element list of a set or map.
var nftSetElems = regexp.MustCompile(`(?s)set (\S+) \{[^}]*?elements = \{([^}]*)\}|map (\S+) \{[^}]*?elements = \{([^}]*)\}`)

// nftElements lists "<set> <element>" of every set and map of an nft
// table listing.
func nftElements(listing string) []string {
	var out []string
	for _, m := range nftSetElems.FindAllStringSubmatch(listing, -1) {
		name, elems := m[1], m[2]
		if name == "" {
			name, elems = m[3], m[4]
		}
		for e := range strings.SplitSeq(elems, ",") {
			if e = strings.Join(strings.Fields(e), " "); e != "" {
				out = append(out, name+" "+e)
			}
		}
	}
	return out
}

// Leaked lists, per kind, what after holds that h did not: the host state an
// operation left behind. Empty means nothing leaked.
func (h HostState) Leaked(after HostState) []string {
	var out []string
	kinds := make([]string, 0, len(after))
	for k := range after {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		for _, item := range after[k] {
			if !slices.Contains(h[k], item) {
				out = append(out, k+": "+item)
			}
		}
	}
	return out
}

// WaitNoLeaks waits (up to a minute: some teardown is asynchronous) until
// the host holds nothing that before did not, and fails t naming every
// leftover otherwise. keep lists substrings of items that may stay (the
// objects the test still expects to exist).
func (s *Server) WaitNoLeaks(t testing.TB, before HostState, keep ...string) {
	t.Helper()
	var left []string
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		left = slices.DeleteFunc(before.Leaked(s.HostState(ctx)), func(item string) bool {
			return slices.ContainsFunc(keep, func(k string) bool { return k != "" && strings.Contains(item, k) })
		})
		cancel()
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("host state leaked:\n  %s", strings.Join(left, "\n  "))
	}
}
