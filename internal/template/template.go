// Package template owns sandbox templates: read-only root filesystems shared
// by every sandbox started from them, plus the defaults those sandboxes get.
//
// A template is a stack of layers from the content-addressed layer store
// (<dir>/layers/<sha256>/rootfs) plus a small config (<dir>/<id>/template.json).
// Layers are never written after they are committed, so any number of
// templates, snapshots and sandboxes share one copy on disk and in the page
// cache; sandboxes add their own writable overlay layer on top.
package template

import "time"

// Template is a built, launchable template.
type Template struct {
	ID string `json:"templateID"`
	// TeamID owns the template: its names, tags and builds resolve only
	// inside that team. "" is the operator's: builtins (Definition set) and
	// templates an operator registered; teams see those only when they are
	// builtins or Public.
	TeamID string `json:"teamID,omitempty"`
	// Public makes a template usable (create, FROM, GET) by every team; only
	// the operator sets it (`agentbox template publish`). Tags, builds and
	// deletion stay the owner's.
	Public  bool     `json:"public,omitempty"`
	Aliases []string `json:"aliases"`        // e.g. ["base"]; the create API accepts id or alias
	Tags    []string `json:"tags,omitempty"` // "alias:tag" resolves to the newest template with both
	// LayerIDs are the layers in the store, lowest first. An entry that is a
	// template ID instead names that template's own rootfs dir (templates
	// built before the layer store existed).
	LayerIDs       []string          `json:"layers,omitempty"`
	Layers         []string          `json:"-"`              // absolute rootfs dirs, lowest first (filled on load)
	CPUCount       int               `json:"cpuCount"`       // default CPUs for sandboxes
	MemoryMB       int               `json:"memoryMB"`       // default memory limit
	DiskMB         int               `json:"diskSizeMB"`     // default writable-layer size
	DefaultUser    string            `json:"defaultUser"`    // user for processes when the request names none
	DefaultWorkdir string            `json:"defaultWorkdir"` // cwd for processes when the request names none
	Env            map[string]string `json:"env,omitempty"`  // env for every process
	// StartCmd is started by envd at /init (through /bin/sh, as root, in
	// DefaultWorkdir, with the sandbox's env vars; output in
	// /.agentbox/log/start.log) and keeps running beside the sandbox.
	// Creation does not wait for it; ReadyCmd, if set, does.
	StartCmd string `json:"startCmd,omitempty"`
	// ReadyCmd is run repeatedly after the start command until it exits 0;
	// sandbox creation waits for it and fails with its output on timeout.
	ReadyCmd string `json:"readyCmd,omitempty"`
	// ExposedPorts are informational (EXPOSE in a Dockerfile, image config).
	ExposedPorts []int `json:"exposedPorts,omitempty"`
	// Isolation is the runtime tier sandboxes of this template run under;
	// "" means the server's default.
	Isolation string `json:"isolation,omitempty"`
	Source    string `json:"source,omitempty"` // what it was built from, for humans
	// BuildID is the E2B build API's ID of the build that made it, kept so
	// the build's status answers "ready" after a server restart.
	BuildID      string      `json:"buildID,omitempty"`
	SizeBytes    int64       `json:"sizeBytes"`    // disk used by the layers
	BuildSeconds float64     `json:"buildSeconds"` // how long the build took
	CreatedAt    time.Time   `json:"createdAt"`
	Definition   *Definition `json:"definition,omitempty"` // what it was built from, if built here
}

// Builtin reports whether t is one of the server's builtins, built by the
// operator from a Definition.
func (t *Template) Builtin() bool { return t.TeamID == "" && t.Definition != nil }

// VisibleTo reports whether team may use t: its own, a builtin, or public.
// The empty team (the operator's internal lookups) sees builtins and public
// templates only.
func (t *Template) VisibleTo(team string) bool {
	return (team != "" && t.TeamID == team) || t.Builtin() || t.Public
}

// OwnedBy reports whether team owns t (and may build over, tag, untag or
// delete it).
func (t *Template) OwnedBy(team string) bool { return team != "" && t.TeamID == team }

// ReservedName reports whether name belongs to a builtin template, which no
// team may build, tag or own.
func ReservedName(name string) bool {
	_, ok := BuiltinDefinitions()[name]
	return ok
}
