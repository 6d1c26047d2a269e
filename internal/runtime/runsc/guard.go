package runsc

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// A gVisor sandbox costs the host more than the sentry accounts to it:
// with systrap every address space has a stub process on the host, whose
// memory and kernel structures stay after its tasks end, so a fork bomb
// fills the host cgroup's memory about twice as fast as its tasks' own use
// and the host's OOM killer then ends the sentry, the whole sandbox with
// it. Nothing inside can stop it in time: envd gets ~1/N of the sentry's
// CPU under N runnable tasks. The guard runs in the server, outside the
// sandbox's CPU share: it watches each gVisor sandbox's host cgroup and,
// when its memory nears the limit while it holds many host processes,
// kills the largest process groups of the sandbox's commands (a fork
// bomb's). The sandbox and its control plane survive; the kill is counted
// (LimitCounters.GuardKills) and the manager records it with its reason.

// GuardInterval is how often the guard samples the host cgroups. A fork bomb
// grows the host cost by ~150 MiB/s here, well inside the headroom below.
const GuardInterval = 100 * time.Millisecond

// guardFile in the bundle directory counts the guard's interventions, so the
// count survives a server restart like the cgroup's own counters.
const guardFile = "hostguard.count"

// headroom is how far below the host cgroup's memory limit the guard acts:
// half the limit, within [384 MiB, 1 GiB], at most three quarters of it.
// Listing and killing take the guard 1-3 s against a bomb whose host cost
// grows by ~150 MiB/s, whatever the sandbox's size (the bomb's speed is
// the CPU's); minHostProcs keeps a workload's own memory out of it.
func headroom(limit uint64) uint64 {
	return min(max(limit/2, 384<<20), 1<<30, limit/4*3)
}

// minHostProcs is the number of host processes (systrap's stubs, one per
// address space, kept after their tasks end) from which the guard takes a
// sandbox near its memory limit for one that starts processes without
// bound: below it, the memory is the workload's own and the sandbox's
// memory limit deals with it as on any tier.
const minHostProcs = 256

// overLine reports whether a sandbox with procs host processes and host
// memory use usage is within headroom of its limit (0: no limit, never).
func overLine(usage, limit uint64, procs int) bool {
	return procs >= minHostProcs && limit > 0 && limit < 1<<62 && usage+headroom(limit) >= limit
}

// hostCost reads the memory use and limit of a sandbox's host cgroup cg,
// and, when the memory is over the line, how many host processes it holds.
func hostCost(cg string) (usage, limit uint64, procs int, err error) {
	root := "/sys/fs/cgroup"
	dir := filepath.Join(root, "memory", cg)
	files := [2]string{"memory.usage_in_bytes", "memory.limit_in_bytes"}
	if bundle.IsCgroupV2() {
		dir, files = filepath.Join(root, cg), [2]string{"memory.current", "memory.max"}
	}
	var v [2]uint64
	for i, name := range files {
		f := filepath.Join(dir, name)
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, 0, 0, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		if v[i], err = strconv.ParseUint(s, 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("%s: %w", f, err)
		}
	}
	if !overLine(v[0], v[1], minHostProcs) {
		return v[0], v[1], 0, nil // the process count cannot matter
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return 0, 0, 0, err
	}
	return v[0], v[1], bytes.Count(b, []byte("\n")), nil
}

// Guard watches the host cgroup of every running gVisor sandbox until ctx
// ends; see the top of this file.
func (d *Driver) Guard(ctx context.Context) {
	if d.Available() != nil {
		return
	}
	w := map[string]*watched{}
	t := time.NewTicker(GuardInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids, err := d.b.List()
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, id := range ids {
			s, ok := w[id]
			if !ok {
				if d.b.Tier(id) != Name {
					continue
				}
				s = &watched{cgroup: d.b.BundleCgroupPath(id), acted: -1}
				w[id] = s
			}
			seen[id] = true
			d.check(ctx, id, s)
		}
		for id, s := range w {
			if !seen[id] || s.cgroup == "" {
				delete(w, id)
			}
		}
	}
}

// watched is the guard's view of one gVisor sandbox.
type watched struct {
	// cgroup is its host cgroup ("" once it cannot be read: looked up
	// again, e.g. after a restore).
	cgroup string
	// acted is the host process count when the guard last acted while the
	// sandbox stays over the line (-1: it did not): stubs of the killed
	// tasks take a while to go, and only a further growth (the bomb again)
	// is acted on, not the owner's next command.
	acted int
}

// check samples one sandbox and acts when it is over the line.
func (d *Driver) check(ctx context.Context, id string, s *watched) {
	usage, limit, procs, err := hostCost(s.cgroup)
	if err != nil {
		s.cgroup = "" // not running
		return
	}
	if !overLine(usage, limit, procs) {
		s.acted = -1
		return
	}
	if s.acted >= 0 && procs < s.acted+minHostProcs {
		return
	}
	n, err := d.defuse(ctx, id)
	if err != nil {
		d.log.Warn("host memory guard: could not stop the sandbox's processes", "id", id, "usageMiB", usage>>20, "limitMiB", limit>>20, "hostProcs", procs, "err", err)
		return
	}
	s.acted = procs
	if err := d.countGuardKill(id); err != nil {
		d.log.Warn("host memory guard: count", "id", id, "err", err)
	}
	d.log.Warn("host memory guard: killed the sandbox's largest process groups before the host's OOM killer ended the sandbox", "id", id, "usageMiB", usage>>20, "limitMiB", limit>>20, "hostProcs", procs, "groups", n)
}

// psEntry is one process of `runsc ps` (its JSON form lists pids only).
type psEntry struct {
	PID, PGID int
}

// parsePS reads `runsc ps`'s table (UID PID PPID PGID C TTY STIME TIME CMD),
// by its header's column names.
func parsePS(out []byte) ([]psEntry, error) {
	var ps []psEntry
	sc := bufio.NewScanner(bytes.NewReader(out))
	pidCol, pgidCol := -1, -1
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if pidCol < 0 {
			pidCol, pgidCol = slices.Index(f, "PID"), slices.Index(f, "PGID")
			if pidCol < 0 || pgidCol < 0 {
				return nil, fmt.Errorf("runsc ps: no PID and PGID columns in %q (a runsc too old for the host memory guard)", sc.Text())
			}
			continue
		}
		if len(f) <= max(pidCol, pgidCol) {
			continue
		}
		pid, err1 := strconv.Atoi(f[pidCol])
		pgid, err2 := strconv.Atoi(f[pgidCol])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("runsc ps: %q: %w", sc.Text(), err)
		}
		ps = append(ps, psEntry{PID: pid, PGID: pgid})
	}
	return ps, sc.Err()
}

// minGroup is the size from which a process group besides the largest is
// killed too (a bomb split over several commands).
const minGroup = 64

// targetGroups are the process groups to kill, largest first: the largest
// group of the sandbox's commands (a fork bomb's processes share its
// command's group: envd runs each command in a group of its own), and any
// other of at least minGroup processes. envd's own group (pid 1's) never.
func targetGroups(ps []psEntry) []int {
	envd := -1
	size := map[int]int{}
	for _, p := range ps {
		if p.PID == 1 {
			envd = p.PGID
		}
		size[p.PGID]++
	}
	delete(size, envd)
	groups := slices.Collect(maps.Keys(size))
	slices.SortFunc(groups, func(a, b int) int { return cmp.Or(size[b]-size[a], a-b) })
	for i, g := range groups {
		if i > 0 && size[g] < minGroup {
			return groups[:i]
		}
	}
	return groups
}

// maxGroupKills bounds the runsc calls of one intervention (each takes up
// to a second from a sandbox under a fork bomb).
const maxGroupKills = 4

// defuse SIGKILLs the largest process groups of sandbox id's commands
// (targetGroups); envd itself stays. It does not pause the sandbox first:
// pausing thousands of tasks takes the sentry over a second, while the bomb's host cost still
// grows, and a group's SIGKILL ends its forks as well. It returns how many
// groups it killed.
func (d *Driver) defuse(ctx context.Context, id string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cid := d.CID(id)
	start := time.Now()
	out, err := d.runscOutput(ctx, "ps", cid)
	if err != nil {
		return 0, err
	}
	ps, err := parsePS(out)
	if err != nil {
		return 0, err
	}
	listed := time.Since(start)
	groups := targetGroups(ps)
	n := 0
	var errs []error
	for _, pg := range groups[:min(len(groups), maxGroupKills)] {
		if err := d.runsc(ctx, "kill", "--pgid", strconv.Itoa(pg), cid, "KILL"); err != nil && !partlySignalled(err) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	d.log.Info("host memory guard: killed the sandbox's largest process groups", "id", id, "processes", len(ps), "groups", groups[:min(len(groups), maxGroupKills)], "killed", n, "ps", listed, "took", time.Since(start))
	if n == 0 {
		return 0, fmt.Errorf("no process group of the sandbox's commands was killed (%d processes): %w", len(ps), errors.Join(errs...))
	}
	return n, nil
}

// partlySignalled reports whether a failed `runsc kill --pgid` reached the
// group anyway: the sentry signals each member and reports ESRCH ("no such
// process") when one was exiting meanwhile, which under a fork bomb is
// nearly always; a group that is gone is "no such process group".
func partlySignalled(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such process") && !strings.Contains(msg, "no such process group")
}

func (d *Driver) runscOutput(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--root", d.Root}, d.ExtraArgs...)
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, d.Binary, full...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (d *Driver) runsc(ctx context.Context, args ...string) error {
	_, err := d.runscOutput(ctx, args...)
	return err
}

// countGuardKill adds one to the sandbox's intervention count.
func (d *Driver) countGuardKill(id string) error {
	n := d.guardKills(id)
	p := filepath.Join(d.b.Dir(id), guardFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(n+1, 10)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (d *Driver) guardKills(id string) uint64 {
	f, err := os.Open(filepath.Join(d.b.Dir(id), guardFile))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(sc.Text()), 10, 64)
	return n
}

// LimitCounters adds the guard's interventions to the cgroup's counters.
func (d *Driver) LimitCounters(ctx context.Context, id string) (runtime.LimitCounters, error) {
	c, err := d.Base.LimitCounters(ctx, id)
	if err != nil {
		return c, err
	}
	c.GuardKills = d.guardKills(id)
	return c, nil
}
