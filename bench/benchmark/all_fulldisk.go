package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/diskspace"
)

// The full-disk section's server: a data disk small enough to fill in a
// moment, and a reserve well inside it.
const (
	fullDiskMB        = 512
	fullDiskReserveMB = 64
)

// fullDiskTarget is the goal column of rows the issue gives no figure for.
const fullDiskTarget = "no target; 507, no loss"

// counterCmd counts in memory in the background and writes the count to
// a file: a count that keeps rising shows the process (and, after a
// resume, its memory) is alive.
const counterCmd = `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &`

// fullDiskRows starts a server of its own on a small data disk, fills the
// disk to under the reserve with a running and a paused sandbox on it,
// and measures what is refused (and how), what keeps working, and how
// soon work is admitted again once the filler is gone; then it stops that
// server and checks that nothing of it is left on the host.
func fullDiskRows(ctx context.Context, a *allRun) []TargetRow {
	own := a.cfg.FullDisk
	if own.Bin == "" {
		return []TargetRow{failed(0, "full disk", errors.New("no agentbox binary to start the section's own server (--agentbox)"))}
	}
	own.DataDiskMB = fullDiskMB
	own.Args = append(slices.Clone(own.Args), "--disk-reserve-mb", strconv.Itoa(fullDiskReserveMB))
	if own.TemplateDir == "" {
		own.TemplateDir = a.cfg.TemplateDir
	}
	srv, err := StartServer(ctx, own, a.log)
	var rows []TargetRow
	if err == nil {
		rows = fullDisk(ctx, a, srv)
	} else {
		rows = []TargetRow{failed(0, "full disk: the section's own server", err)}
	}
	left := TargetRow{Figure: "full disk: left on the host after the section (server, mount, loops, netns, cgroups)", Goal: "nothing", Floor: "nothing"}
	if srv == nil {
		return rows
	}
	if err := srv.Stop(context.WithoutCancel(ctx)); err != nil {
		left.Err = firstLine(err.Error())
	} else {
		loops := hostLoopsUnder(srv.DataDir)
		netns := countEntries(filepath.Join("/run", own.Instance, "netns"))
		cg, _ := filepath.Glob("/sys/fs/cgroup/*/" + own.Instance)
		left.Value = fmt.Sprintf("mounts %d, loops %d, netns %d, cgroups %d", len(mountsUnder(srv.DataDir)), loops, netns, len(cg))
		left.Met = left.Value == "mounts 0, loops 0, netns 0, cgroups 0"
	}
	return append(rows, left)
}

// fullDisk is the section's measurement against srv.
func fullDisk(ctx context.Context, a *allRun, srv *Server) []TargetRow {
	c := wire.New(srv.URL, srv.APIKey)
	api := func(method, path string, body any) (int, []byte) {
		return apiStatus(ctx, srv.URL, srv.APIKey, method, path, body)
	}
	create := func() (*wire.Sandbox, error) {
		return c.Create(ctx, wire.CreateRequest{TemplateID: a.cfg.Template, Timeout: 600})
	}
	fail := func(what string, err error) []TargetRow {
		return []TargetRow{failed(0, "full disk: "+what, err)}
	}

	// A running sandbox with a counter and a file, a paused one with a
	// counter, and a volume.
	run, err := create()
	if err != nil {
		return fail("create the running sandbox", err)
	}
	const keep = "kept through a full disk"
	if _, err := c.Run(ctx, run, "", counterCmd+" echo '"+keep+"' > /home/user/keep.txt"); err != nil {
		return fail("start the running sandbox's counter", err)
	}
	paused, err := create()
	if err != nil {
		return fail("create the sandbox to pause", err)
	}
	if _, err := c.Run(ctx, paused, "", counterCmd); err != nil {
		return fail("start the paused sandbox's counter", err)
	}
	// Counted past 3 before the pause: a counter that goes on from there
	// after the resume is the paused process, with its memory.
	atPause, err := risingCount(ctx, c, paused, 3)
	if err != nil {
		return fail("the counter of the sandbox to pause", err)
	}
	if st, b := api(http.MethodPost, "/sandboxes/"+paused.SandboxID+"/pause", nil); st/100 != 2 {
		return fail("pause", fmt.Errorf("%d %s", st, b))
	}
	st, b := api(http.MethodPost, "/volumes", map[string]any{"name": "full-disk", "sizeMB": 16})
	var vol struct{ VolumeID, Token string }
	if st != http.StatusCreated || json.Unmarshal(b, &vol) != nil {
		return fail("create a volume", fmt.Errorf("%d %s", st, b))
	}
	before, err := roundTrips(ctx, c, run, a.cfg.Commands)
	if err != nil {
		return fail("command round trip before the disk is full", err)
	}
	idsBefore, err := listIDs(ctx, c)
	if err != nil {
		return fail("list before the disk is full", err)
	}

	// Fill to half the reserve: under it, with room for the server's own
	// records.
	free, err := diskspace.Free(srv.DataDir)
	if err != nil {
		return fail("free space of the data disk", err)
	}
	filler := filepath.Join(srv.DataDir, "bench-filler")
	fillStart := time.Now()
	if err := fill(filler, int64(free)-fullDiskReserveMB/2<<20); err != nil {
		return fail("fill the data disk", err)
	}
	defer os.Remove(filler)
	var refused time.Duration
	var createSt int
	var createBody []byte
	for deadline := time.Now().Add(30 * time.Second); ; {
		sb, err := create()
		if err == nil {
			_ = c.Kill(ctx, sb.SandboxID)
		}
		var we *wire.Error
		if errors.As(err, &we) {
			createSt, createBody = we.Status, []byte(we.Body)
		}
		if createSt == http.StatusInsufficientStorage || time.Now().After(deadline) || ctx.Err() != nil {
			refused = time.Since(fillStart)
			break
		}
	}
	names := func(b []byte) string {
		if strings.Contains(string(b), "data disk") && strings.Contains(string(b), "free space") {
			return ", names the data disk and what to free"
		}
		return ", does NOT name the disk: " + firstLine(string(b))
	}
	value := fmt.Sprintf("%s, %d%s", round(refused), createSt, names(createBody))
	if createSt == 0 {
		value = fmt.Sprintf("creates still admitted after %s", round(refused))
	}
	rows := []TargetRow{{Figure: "full disk: fill → a create refused (status)", Value: value,
		Floor: "507", Goal: fullDiskTarget, Met: createSt == http.StatusInsufficientStorage && strings.Contains(names(createBody), "names the")}}

	volWrite := func() (int, []byte) {
		return send(ctx, http.MethodPut, srv.URL+"/volumecontent/"+vol.VolumeID+"/file?path=/a.txt",
			bytes.NewReader([]byte("hello")), map[string]string{"Authorization": "Bearer " + vol.Token})
	}
	var refusals []string
	allRefused := true
	for _, op := range []struct {
		name string
		do   func() (int, []byte)
	}{
		{"snapshot", func() (int, []byte) {
			return api(http.MethodPost, "/sandboxes/"+run.SandboxID+"/snapshots", map[string]any{})
		}},
		{"pause", func() (int, []byte) { return api(http.MethodPost, "/sandboxes/"+run.SandboxID+"/pause", nil) }},
		{"volume create", func() (int, []byte) {
			return api(http.MethodPost, "/volumes", map[string]any{"name": "another", "sizeMB": 16})
		}},
		{"volume write", volWrite},
	} {
		st, b := op.do()
		refusals = append(refusals, fmt.Sprintf("%s %d", op.name, st))
		if st != http.StatusInsufficientStorage || !strings.Contains(names(b), "names the") {
			allRefused = false
			a.note("full disk: %s answered %d %s", op.name, st, firstLine(string(b)))
		}
	}
	rows = append(rows, TargetRow{Figure: "full disk: refusals (status each)", Value: fmt.Sprintf("create %d, %s", createSt, strings.Join(refusals, ", ")),
		Floor: "507 each", Goal: fullDiskTarget, Met: allRefused && createSt == http.StatusInsufficientStorage})

	// What runs keeps running.
	full, err := roundTrips(ctx, c, run, a.cfg.Commands)
	keptRow := TargetRow{Figure: "full disk: command round trip on a running sandbox, full (p50) vs before", Goal: "no target; keeps running"}
	if err != nil {
		keptRow.Err = firstLine(err.Error())
	} else {
		keptRow.Value, keptRow.Floor = round(pct(full, 50)).String(), round(pct(before, 50)).String()
		keptRow.Ratio = float64(pct(full, 50)) / float64(max(pct(before, 50), 1))
		keptRow.Met = true
	}
	rows = append(rows, keptRow)
	liveRow := TargetRow{Figure: "full disk: the running sandbox's counter and file while full", Floor: "counting, intact", Goal: "no target; no loss"}
	n1, err1 := risingCount(ctx, c, run, 0)
	n2, err2 := risingCount(ctx, c, run, n1)
	r, err3 := c.Run(ctx, run, "", "cat /home/user/keep.txt")
	if err := errors.Join(err1, err2, err3); err != nil {
		liveRow.Err = firstLine(err.Error())
	} else {
		intact := strings.TrimSpace(r.Stdout) == keep
		liveRow.Value = fmt.Sprintf("counter %d → %d, file intact %t", n1, n2, intact)
		liveRow.Met = n2 > n1 && intact
	}
	rows = append(rows, liveRow)
	idsFull, errFull := listIDs(ctx, c)

	// Free the filler: work is admitted again without a restart.
	freeStart := time.Now()
	if err := os.Remove(filler); err != nil {
		return append(rows, failed(0, "full disk: remove the filler", err))
	}
	var again *wire.Sandbox
	for deadline := time.Now().Add(30 * time.Second); ; {
		if again, err = create(); err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	backRow := TargetRow{Figure: "full disk: filler removed → first create succeeds (no restart)", Floor: "-", Goal: "no target; works again"}
	if err != nil {
		backRow.Err = firstLine(err.Error())
	} else {
		backRow.Value, backRow.Met = round(time.Since(freeStart)).String(), true
	}
	rows = append(rows, backRow)
	resumeRow := TargetRow{Figure: "full disk: the paused sandbox resumes with its memory (counter)", Floor: fmt.Sprintf("%d at pause", atPause), Goal: "no target; no loss"}
	if st, b := api(http.MethodPost, "/v2/sandboxes/"+paused.SandboxID+"/connect", map[string]any{"timeout": 600}); st/100 != 2 {
		resumeRow.Err = fmt.Sprintf("resume: %d %s", st, firstLine(string(b)))
	} else if n, err := risingCount(ctx, c, paused, atPause); err != nil {
		resumeRow.Err = firstLine(err.Error())
	} else {
		// A fresh process would count from 1; the paused one goes on.
		resumeRow.Value, resumeRow.Met = fmt.Sprintf("counter %d → %d", atPause, n), n > atPause
	}
	rows = append(rows, resumeRow)

	idsAfter, errAfter := listIDs(ctx, c)
	if again != nil {
		idsAfter = slices.DeleteFunc(idsAfter, func(id string) bool { return id == again.SandboxID })
	}
	dbRow := TargetRow{Figure: "full disk: sandboxes listed before / while full / after", Floor: "same ids", Goal: "no target; consistent"}
	if err := errors.Join(errFull, errAfter); err != nil {
		dbRow.Err = firstLine(err.Error())
	} else {
		dbRow.Value = fmt.Sprintf("%d / %d / %d", len(idsBefore), len(idsFull), len(idsAfter))
		dbRow.Met = slices.Equal(idsBefore, idsFull) && slices.Equal(idsBefore, idsAfter)
		if !dbRow.Met {
			dbRow.Value += fmt.Sprintf(" (%v / %v / %v)", idsBefore, idsFull, idsAfter)
		}
	}
	return append(rows, dbRow)
}

// fill allocates n bytes to path.
func fill(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, n); err != nil {
		return fmt.Errorf("allocate %d MiB: %w", n>>20, err)
	}
	return f.Close()
}

// risingCount waits until the sandbox's counter is above after, and
// returns it.
func risingCount(ctx context.Context, c *wire.Client, sb *wire.Sandbox, after int) (int, error) {
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		r, err := c.Run(ctx, sb, "", "cat /tmp/count")
		if err != nil {
			return 0, fmt.Errorf("read the counter: %w", err)
		}
		last = strings.TrimSpace(r.Stdout)
		if n, err := strconv.Atoi(last); err == nil && n > after {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("the counter stayed at %q, not above %d", last, after)
}

// roundTrips is n command round trips on sb.
func roundTrips(ctx context.Context, c *wire.Client, sb *wire.Sandbox, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range max(n, 1) {
		t := time.Now()
		if _, err := c.Run(ctx, sb, "", "true"); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// listIDs is the sorted ids the server lists.
func listIDs(ctx context.Context, c *wire.Client) ([]string, error) {
	l, err := c.List(ctx, nil)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range l {
		ids = append(ids, s.SandboxID)
	}
	slices.Sort(ids)
	return ids, nil
}

// apiStatus sends one API call and returns the status and body.
func apiStatus(ctx context.Context, base, key, method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, []byte(err.Error())
		}
		rd = bytes.NewReader(b)
	}
	return send(ctx, method, base+path, rd, map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
}

// send makes one request with headers and returns the status and body
// (an error as the body, with status 0).
func send(ctx context.Context, method, url string, body io.Reader, headers map[string]string) (int, []byte) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return 0, []byte(err.Error())
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// hostLoopsUnder counts loop devices backed by a file under dir.
func hostLoopsUnder(dir string) int {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	n := 0
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			n++
		}
	}
	return n
}

// RunFullDisk runs the full-disk section alone (it needs no other server)
// and prints its rows and notes.
func RunFullDisk(ctx context.Context, cfg AllConfig, w io.Writer, log *slog.Logger) ([]TargetRow, error) {
	cfg.defaults()
	a := &allRun{cfg: cfg, log: log}
	start := time.Now()
	rows := fullDiskRows(ctx, a)
	if err := WriteTargets(w, rows); err != nil {
		return rows, err
	}
	fmt.Fprintln(w)
	for _, n := range a.notes {
		fmt.Fprintln(w, n)
	}
	fmt.Fprintf(w, "sections took: full disk %s\n", time.Since(start).Round(time.Second))
	return rows, ctx.Err()
}
