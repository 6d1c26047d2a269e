// Package template owns sandbox templates: read-only root filesystems shared
// by every sandbox started from them, plus the defaults those sandboxes get.
package template

import "time"

// Template is a built, launchable template.
type Template struct {
	ID             string            `json:"templateID"`
	Aliases        []string          `json:"aliases"`        // e.g. ["base"]; the create API accepts id or alias
	Layers         []string          `json:"-"`              // absolute rootfs dirs, lowest first (filled on load)
	CPUCount       int               `json:"cpuCount"`       // default CPUs for sandboxes
	MemoryMB       int               `json:"memoryMB"`       // default memory limit
	DiskMB         int               `json:"diskSizeMB"`     // default writable-layer size
	DefaultUser    string            `json:"defaultUser"`    // user for processes when the request names none
	DefaultWorkdir string            `json:"defaultWorkdir"` // cwd for processes when the request names none
	Env            map[string]string `json:"env,omitempty"`  // env for every process
	SizeBytes      int64             `json:"sizeBytes"`      // disk used by the layers
	BuildSeconds   float64           `json:"buildSeconds"`   // how long the build took
	CreatedAt      time.Time         `json:"createdAt"`
	Definition     *Definition       `json:"definition,omitempty"` // what it was built from, if built here
}
