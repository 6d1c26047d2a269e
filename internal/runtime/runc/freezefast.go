package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CRIU freezes a thawed cgroup by writing FROZEN and checking its state in
// steps of 100 ms; on the v1 freezer the first check, right after the
// write, nearly always finds FREEZING, so every pause slept 100 ms for a
// freeze that takes a few. Given a cgroup that is already frozen, CRIU
// seizes its tasks at once. So a pause freezes the sandbox itself first,
// checking every millisecond; if the freezer does not settle quickly (a
// busy host), it thaws again and CRIU freezes as before, within its own
// timeout and retry.
const (
	// quickFreezeWait bounds the pause's own freeze before CRIU's.
	quickFreezeWait = time.Second
	// quickFreezePoll is how often it checks the freezer's state.
	quickFreezePoll = time.Millisecond
	// quickFreezeRewrite: every so many checks FROZEN is written again,
	// which on the v1 freezer catches tasks that were mid-fork.
	quickFreezeRewrite = 50
)

// freezerStateFile returns the v1 freezer.state file of sandbox id's
// cgroup from runc's state, or "" when runc's state names no v1 freezer
// (cgroup v2, or an unreadable state: CRIU then freezes as before).
func (d *Driver) freezerStateFile(id string) string {
	b, err := os.ReadFile(filepath.Join(d.cfg.Root, d.CID(id), "state.json"))
	if err != nil {
		return ""
	}
	var st struct {
		Cgroups map[string]string `json:"cgroup_paths"`
	}
	if json.Unmarshal(b, &st) != nil {
		return ""
	}
	p := st.Cgroups["freezer"]
	if p == "" || !filepath.IsAbs(p) {
		return ""
	}
	return filepath.Join(p, "freezer.state")
}

// quickFreeze freezes the cgroup whose v1 freezer.state file is state and
// waits up to wait for it to be FROZEN. It returns whether it is; if not,
// it has thawed the cgroup again.
func quickFreeze(ctx context.Context, state string, wait time.Duration) bool {
	if state == "" {
		return false
	}
	read := func() string {
		b, err := os.ReadFile(state)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	if read() != "THAWED" {
		return false // frozen by someone else, or unreadable: leave it to CRIU
	}
	deadline := time.Now().Add(wait)
	for i := 0; ; i++ {
		if i%quickFreezeRewrite == 0 {
			if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
				break
			}
		}
		if read() == "FROZEN" {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(quickFreezePoll)
	}
	_ = os.WriteFile(state, []byte("THAWED"), 0)
	return false
}

// thawFile thaws the cgroup whose v1 freezer.state file is state; a cgroup
// that is gone (the dump ended its tasks) needs nothing.
func thawFile(state string) {
	_ = os.WriteFile(state, []byte("THAWED"), 0)
}

// caughtExiting reports whether the failed dump whose CRIU work dir is work
// met a process caught mid-exit by the freezer (a dead thread-group leader
// whose threads still exit), which a second freeze a moment later does not.
func caughtExiting(work string) bool {
	b, err := os.ReadFile(filepath.Join(work, "dump.log"))
	return err == nil && (bytes.Contains(b, []byte("Zombies with threads are not supported")) || bytes.Contains(b, []byte(") found while seizing")))
}
