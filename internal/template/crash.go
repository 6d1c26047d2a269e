package template

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/crashpoint"
)

// Crash points of template uploads and builds (--test-crash-after
// <operation>/<step>): the server is killed right after the named step,
// and the next start must find every object the client was told exists
// and nothing half-made.
const (
	OpUpload = "template-upload"
	// StepUploadReceived: the bytes are in a temporary part file, not yet
	// counted as an upload.
	StepUploadReceived = "bytes received"
	// StepUploadRenamed: the tar has its final name; its record is not
	// written yet, so the upload does not exist for a client.
	StepUploadRenamed = "tar renamed"
	// StepUploadCommitted: the record is written; the upload counts.
	StepUploadCommitted = "committed"

	OpBuild = "template-build"
	// StepBuildRequested: the job record is written, status waiting.
	StepBuildRequested = "requested"
	// StepBuildStarted: the job record says building.
	StepBuildStarted = "started"
	// StepBuildPublished: the template is in the store, the job still
	// says building.
	StepBuildPublished = "template published"
	// StepBuildFinished: the job record says ready or error.
	StepBuildFinished = "job finished"
)

// CrashSteps lists the crash points of template uploads and builds, in
// order, as {operation, step}.
func CrashSteps() [][2]string {
	return [][2]string{
		{OpUpload, StepUploadReceived},
		{OpUpload, StepUploadRenamed},
		{OpUpload, StepUploadCommitted},
		{OpBuild, StepBuildRequested},
		{OpBuild, StepBuildStarted},
		{OpBuild, StepBuildPublished},
		{OpBuild, StepBuildFinished},
	}
}

// SetCrash arms the test crash switch (zero: never crashes). Call before
// the store serves requests.
func (s *Store) SetCrash(c crashpoint.Switch) { s.crash = c }

// SetInstance names this server's part files (`.part-<instance>-…`), so
// that its startup removes only its own: servers of other instances may
// share the template directory and be receiving uploads right now. Call
// before serving.
func (s *Store) SetInstance(name string) { s.instance = name }

// partPrefix is the name prefix of this server's upload part files.
func (s *Store) partPrefix() string {
	if s.instance == "" {
		return ".part-"
	}
	return ".part-" + s.instance + "-"
}

// reconcileUploads removes what an earlier process of this instance left
// half-made in the upload directories: its part files, record temp files, and
// tars without a record (a crash between the rename and the record).
// None of them was ever reported to a client as stored, and none is
// counted by the ledger, so they would otherwise sit on the disk until the
// sweep's TTL. It runs before the store serves anything.
func (s *Store) reconcileUploads() error {
	root := filepath.Join(s.dir, uploadsDir)
	teams, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, t := range teams {
		dir := filepath.Join(root, t.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			switch {
			case strings.HasPrefix(name, s.partPrefix()), strings.HasSuffix(name, ".json.tmp"):
			case strings.HasSuffix(name, ".tar"):
				rec := filepath.Join(dir, strings.TrimSuffix(name, ".tar")+".json")
				if _, err := os.Stat(rec); !errors.Is(err, fs.ErrNotExist) {
					continue
				}
			default:
				continue
			}
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("leftover upload file not removed", "path", filepath.Join(dir, name), "err", err)
			}
		}
	}
	return nil
}
