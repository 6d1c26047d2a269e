// Package fake holds in-memory stand-ins for the host side of a sandbox —
// the container runtime (with its checkpoint capabilities), the network
// manager and envd — so the sandbox manager's state machine is tested
// without root. One Host ties them together: a container that runs has an
// envd that answers at its network address.
//
// Every call is recorded and every operation can be made to fail once, so a
// test can fail a create at any step and check that the undo of every
// earlier step ran (nothing leaks).
package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Host is one fake machine: runtime, network and envd share its state.
type Host struct {
	Runtime *Runtime
	Network *Network
	Envd    *Envd

	mu    sync.Mutex
	calls []string
	fail  map[string]error
}

// NewHost returns an empty fake host. Close it when done (Envd's server).
func NewHost() *Host {
	h := &Host{fail: map[string]error{}}
	h.Runtime = &Runtime{h: h, containers: map[string]*container{}}
	h.Network = &Network{h: h, endpoints: map[string]network.Endpoint{}, policies: map[string]network.Policy{}}
	h.Envd = newEnvd(h)
	return h
}

// Close stops the fake envd's server.
func (h *Host) Close() { h.Envd.srv.Close() }

// FailNext makes the next call of op ("runtime.Create", "network.Attach",
// "envd.init", ...) fail with err.
func (h *Host) FailNext(op string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fail[op] = err
}

// Calls returns every recorded call ("runtime.Create i123"), oldest first.
func (h *Host) Calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// ResetCalls forgets the recorded calls.
func (h *Host) ResetCalls() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = nil
}

// call records op on id and returns the failure set for op, if any.
func (h *Host) call(op, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, op+" "+id)
	if err, ok := h.fail[op]; ok {
		delete(h.fail, op)
		return err
	}
	return nil
}

// Leaks lists what the host still holds: containers, endpoints, pause
// images. A test that expects nothing left compares it with nil.
func (h *Host) Leaks() []string {
	var out []string
	h.Runtime.mu.Lock()
	for id := range h.Runtime.containers {
		out = append(out, "container "+id)
	}
	h.Runtime.mu.Unlock()
	h.Network.mu.Lock()
	for id := range h.Network.endpoints {
		out = append(out, "endpoint "+id)
	}
	h.Network.mu.Unlock()
	slices.Sort(out)
	return out
}

// ---- runtime ----

// imageFile holds envd's memory in a snapshot's image dir.
const imageFile = "fake-envd.json"

type container struct {
	spec     runtime.Spec
	status   runtime.Status
	pause    *envdState // the pause image: envd's memory, or files only
	fsOnly   bool
	limits   runtime.LimitCounters // limit hits (Hit)
	diskFull bool                  // its writable disk is used up (Hit)
}

// Runtime is an in-memory runtime.Runtime and runtime.Checkpointer with
// one tier ("runc"; "runsc" too when Tiers says so).
type Runtime struct {
	h          *Host
	mu         sync.Mutex
	containers map[string]*container
	// Tiers the runtime runs besides "runc" (e.g. "runsc").
	Tiers []string
}

func (r *Runtime) get(id string) (*container, error) {
	c, ok := r.containers[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

// Create starts a container whose envd boots fresh.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) error {
	if err := r.h.call("runtime.Create", spec.ID); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.containers[spec.ID]; ok {
		return fmt.Errorf("container %s: %w", spec.ID, errdefs.ErrConflict)
	}
	r.containers[spec.ID] = &container{spec: spec, status: runtime.StatusRunning}
	r.h.Envd.boot(spec.ID, nil)
	return nil
}

// Delete removes the container and its pause image; unknown ids are fine.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := r.h.call("runtime.Delete", id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.containers, id)
	r.mu.Unlock()
	r.h.Envd.stop(id)
	return nil
}

// State reports the container's status.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.get(id)
	if err != nil {
		return "", err
	}
	return c.status, nil
}

// Stats returns zero figures for a known container, but a used-up disk
// after Hit(id, "disk-full").
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.get(id)
	if err != nil {
		return runtime.Stats{}, err
	}
	var st runtime.Stats
	if c.diskFull {
		st.DiskTotal = uint64(max(c.spec.Resources.DiskMB, 1)) << 20
		st.DiskUsed = st.DiskTotal
	}
	return st, nil
}

// LimitCounters returns the container's limit hits (Hit).
func (r *Runtime) LimitCounters(ctx context.Context, id string) (runtime.LimitCounters, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.get(id)
	if err != nil {
		return runtime.LimitCounters{}, err
	}
	return c.limits, nil
}

// Hit makes container id hit a limit, as its cgroup or disk would record
// it: "oom" (a process killed for memory), "pids" (a fork refused) or
// "disk-full".
func (r *Runtime) Hit(id, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return
	}
	switch what {
	case "oom":
		c.limits.OOMKills++
	case "pids":
		c.limits.PIDsMax++
	case "disk-full":
		c.diskFull = true
	}
}

// List returns every container id.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.containers))
	for id := range r.containers {
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// Spec returns the spec a container was made with.
func (r *Runtime) Spec(id string) (runtime.Spec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return runtime.Spec{}, false
	}
	return c.spec, true
}

// Stop makes a running container stop as if its init died.
func (r *Runtime) Stop(id string) {
	r.mu.Lock()
	if c, ok := r.containers[id]; ok {
		c.status = runtime.StatusStopped
	}
	r.mu.Unlock()
	r.h.Envd.stop(id)
}

// TierAvailable accepts runc and the configured extra tiers.
func (r *Runtime) TierAvailable(tier string) error {
	if tier == "runc" || slices.Contains(r.Tiers, tier) {
		return nil
	}
	return fmt.Errorf("tier %s is not installed: %w", tier, errdefs.ErrUnavailable)
}

// CheckpointSupported says checkpoints work.
func (r *Runtime) CheckpointSupported() error { return nil }

// Checkpoint keeps envd's state as the image: in ImageDir (a snapshot) or
// as the container's pause image. Directories the manager expects on disk
// (ImageDir, UpperCopy) are made.
func (r *Runtime) Checkpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) error {
	if err := r.h.call("runtime.Checkpoint", id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.get(id)
	if err != nil {
		return err
	}
	st := r.h.Envd.state(id)
	if opts.FilesystemOnly {
		st = nil
	}
	for _, dir := range []string{opts.ImageDir, opts.UpperCopy} {
		if dir != "" {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
		}
	}
	if opts.ImageDir != "" {
		if st != nil {
			// In the directory, as a real image: the manager renames it.
			b, err := json.Marshal(st)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(opts.ImageDir, imageFile), b, 0o600); err != nil {
				return err
			}
		}
	} else {
		c.pause, c.fsOnly = st, opts.FilesystemOnly
	}
	if !opts.LeaveRunning {
		c.status = runtime.StatusStopped
		r.h.Envd.stop(id)
	}
	return nil
}

// Restore resumes a container in place (its pause image) or starts a new
// one from a snapshot's image dir.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions) error {
	if err := r.h.call("runtime.Restore", spec.ID); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.containers[spec.ID]; ok {
		if c.status == runtime.StatusRunning {
			return fmt.Errorf("container %s is running: %w", spec.ID, errdefs.ErrConflict)
		}
		var mem *envdState
		if !opts.FilesystemOnly && !c.fsOnly {
			if c.pause == nil {
				return fmt.Errorf("container %s has no pause image: %w", spec.ID, errdefs.ErrNotFound)
			}
			mem = c.pause
		}
		c.status = runtime.StatusRunning
		r.h.Envd.boot(spec.ID, mem)
		return nil
	}
	var mem *envdState
	if !opts.FilesystemOnly {
		b, err := os.ReadFile(filepath.Join(opts.ImageDir, imageFile))
		if err != nil {
			return fmt.Errorf("image %s: %w", opts.ImageDir, errdefs.ErrNotFound)
		}
		mem = &envdState{}
		if err := json.Unmarshal(b, mem); err != nil {
			return err
		}
	}
	r.containers[spec.ID] = &container{spec: spec, status: runtime.StatusRunning}
	r.h.Envd.boot(spec.ID, mem)
	return nil
}

// HasCheckpoint reports whether the container has a pause image.
func (r *Runtime) HasCheckpoint(ctx context.Context, id string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	return ok && (c.pause != nil || c.fsOnly), nil
}

// DropCheckpoint forgets the pause image.
func (r *Runtime) DropCheckpoint(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.containers[id]; ok {
		c.pause, c.fsOnly = nil, false
	}
	return nil
}

// Freeze marks the container paused.
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	return r.setStatus(id, "runtime.Freeze", runtime.StatusPaused)
}

// Thaw marks it running again.
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	return r.setStatus(id, "runtime.Thaw", runtime.StatusRunning)
}

func (r *Runtime) setStatus(id, op string, st runtime.Status) error {
	if err := r.h.call(op, id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.get(id)
	if err != nil {
		return err
	}
	c.status = st
	return nil
}

// ---- network ----

// Network is an in-memory network manager: /32 addresses from
// 10.99.0.0/16, a policy per sandbox.
type Network struct {
	h         *Host
	mu        sync.Mutex
	next      uint16
	endpoints map[string]network.Endpoint
	policies  map[string]network.Policy
}

// Attach allocates an address and records the policy.
func (n *Network) Attach(ctx context.Context, id string, p network.Policy) (network.Endpoint, error) {
	if err := n.h.call("network.Attach", id); err != nil {
		return network.Endpoint{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.endpoints[id]; ok {
		return network.Endpoint{}, fmt.Errorf("endpoint %s: %w", id, errdefs.ErrConflict)
	}
	n.next++
	ep := network.Endpoint{IP: netip.AddrFrom4([4]byte{10, 99, byte(n.next >> 8), byte(n.next)}), NetNSPath: "/fake/netns/" + id}
	n.endpoints[id] = ep
	n.policies[id] = p
	return ep, nil
}

// Detach forgets the endpoint; unknown ids are fine.
func (n *Network) Detach(ctx context.Context, id string) error {
	if err := n.h.call("network.Detach", id); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.endpoints, id)
	delete(n.policies, id)
	return nil
}

// SetPolicy replaces the sandbox's policy.
func (n *Network) SetPolicy(ctx context.Context, id string, p network.Policy) error {
	if err := n.h.call("network.SetPolicy", id); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.endpoints[id]; !ok {
		return fmt.Errorf("endpoint %s: %w", id, errdefs.ErrNotFound)
	}
	n.policies[id] = p
	return nil
}

// Policy returns the sandbox's current policy.
func (n *Network) Policy(id string) (network.Policy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.policies[id]
	return p, ok
}

// List returns every endpoint's id.
func (n *Network) List(ctx context.Context) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.endpoints))
	for id := range n.endpoints {
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// Lookup returns the sandbox's endpoint.
func (n *Network) Lookup(id string) (network.Endpoint, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ep, ok := n.endpoints[id]
	return ep, ok
}

// DNS is the nameserver sandboxes are given.
func (n *Network) DNS() []string { return []string{"10.99.0.1"} }

// idOf maps an address back to its sandbox.
func (n *Network) idOf(ip netip.Addr) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, ep := range n.endpoints {
		if ep.IP == ip {
			return id, true
		}
	}
	return "", false
}
