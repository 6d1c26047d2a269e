package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/template"
)

// TemplateBuilder is what the build API needs from the template store
// beyond Templates; the API finds it on the store it was given.
type TemplateBuilder interface {
	BuildFromSpec(ctx context.Context, spec template.BuildSpec, progress io.Writer) (*template.Template, error)
	Delete(ctx context.Context, id string) error
	HasUpload(hash string) bool
	PutUpload(hash string, r io.Reader, maxBytes int64) error
	GC(ctx context.Context) (template.GCResult, error)
	DiskUsage(ctx context.Context) (template.Usage, error)
}

// Limits of the build API.
const (
	maxUploadBytes = 1 << 30 // one COPY context archive
	maxBuildTime   = 2 * time.Hour
	maxLogEntries  = 20000 // per build; older entries are dropped first
	uploadTokenTTL = time.Hour
	buildsKept     = 200 // finished builds remembered for status queries
)

// buildRegistry tracks template builds requested through the E2B API. Builds
// live in memory: a server restart forgets them, but a template records the
// ID of the build that made it, so a successful build still reports "ready"
// (without its logs; see finishedBuild).
type buildRegistry struct {
	mu      sync.Mutex
	builds  map[string]*apiBuild // by build ID
	order   []string
	uploads map[string]uploadGrant // by token
	network template.NetworkFunc
}

type uploadGrant struct {
	hash    string
	expires time.Time
}

type apiBuild struct {
	templateID, buildID, name, tag string
	tags                           []string
	cpuCount, memoryMB             int

	mu      sync.Mutex
	status  string // waiting, building, ready, error
	logs    []buildLogEntry
	dropped int
	step    string
	reason  *buildReason
	partial string
}

type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

type buildReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries"`
}

// SetBuildNetwork gives RUN steps of API builds their network namespace
// (builds are untrusted input, like sandboxes). Call before serving.
func (s *Server) SetBuildNetwork(fn template.NetworkFunc) {
	s.builds.mu.Lock()
	defer s.builds.mu.Unlock()
	s.builds.network = fn
}

func (s *Server) builder() (TemplateBuilder, error) {
	b, ok := s.templates.(TemplateBuilder)
	if !ok {
		return nil, fmt.Errorf("this server cannot build templates: %w", errdefs.ErrUnavailable)
	}
	return b, nil
}

// templateBuildRoutes registers the E2B template build API and template
// deletion, plus agentbox's GC and disk usage.
func (s *Server) templateBuildRoutes(mux *http.ServeMux, auth func(string, http.HandlerFunc)) {
	auth("POST /v3/templates", s.requestBuild)
	auth("GET /templates/{id}/files/{hash}", s.fileUploadLink)
	auth("POST /v2/templates/{id}/builds/{buildID}", s.startBuild)
	auth("GET /templates/{id}/builds/{buildID}/status", s.buildStatus)
	auth("GET /templates/{id}/builds/{buildID}/logs", s.buildLogs)
	auth("DELETE /templates/{id}", s.deleteTemplate)
	auth("POST /templates/gc", s.templateGC)
	auth("GET /templates/usage", s.templateUsage)
	s.templateTagRoutes(auth)
	// The upload URL carries a one-time token instead of the API key: the
	// SDK PUTs to it without its usual headers.
	mux.HandleFunc("PUT /templates/uploads/{token}", s.uploadFiles)
}

var aliasPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func newBuildID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

type requestBuildBody struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"` // older SDKs
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	var b requestBuildBody
	if err := decodeBody(w, r, s.MaxBody, false, &b); err != nil {
		writeError(w, err)
		return
	}
	ref := b.Name
	if ref == "" {
		ref = b.Alias
	}
	name, tag, _ := strings.Cut(ref, ":")
	if !aliasPattern.MatchString(name) {
		writeError(w, invalid("name: %q is not a valid template name (lowercase letters, digits, '.', '_', '-'; optional :tag)", ref))
		return
	}
	if tag == "" {
		tag = "default"
	}
	for _, t := range append([]string{tag}, b.Tags...) {
		if !aliasPattern.MatchString(strings.ToLower(t)) {
			writeError(w, invalid("tags: %q is not a valid tag", t))
			return
		}
	}
	if b.CPUCount < 0 || b.CPUCount > 64 || b.MemoryMB < 0 || b.MemoryMB > 1<<20 {
		writeError(w, invalid("cpuCount/memoryMB out of range"))
		return
	}
	bd := &apiBuild{templateID: template.NamedID(name, tag), buildID: newBuildID(), name: name, tag: tag, tags: b.Tags,
		cpuCount: b.CPUCount, memoryMB: b.MemoryMB, status: "waiting"}
	s.builds.mu.Lock()
	if s.builds.builds == nil {
		s.builds.builds = map[string]*apiBuild{}
	}
	s.builds.builds[bd.buildID] = bd
	s.builds.order = append(s.builds.order, bd.buildID)
	for len(s.builds.order) > buildsKept {
		old := s.builds.builds[s.builds.order[0]]
		if old != nil {
			old.mu.Lock()
			done := old.status == "ready" || old.status == "error"
			old.mu.Unlock()
			if !done {
				break
			}
		}
		delete(s.builds.builds, s.builds.order[0])
		s.builds.order = s.builds.order[1:]
	}
	s.builds.mu.Unlock()
	tags := append([]string{tag}, b.Tags...)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": bd.templateID, "buildID": bd.buildID, "names": []string{name + ":" + tag},
		"tags": tags, "aliases": []string{name}, "public": false,
	})
}

func (s *Server) lookupBuild(r *http.Request) (*apiBuild, error) {
	s.builds.mu.Lock()
	bd := s.builds.builds[r.PathValue("buildID")]
	s.builds.mu.Unlock()
	if bd == nil {
		bd = s.finishedBuild(r.Context(), r.PathValue("id"), r.PathValue("buildID"))
	}
	if bd == nil || bd.templateID != r.PathValue("id") {
		return nil, fmt.Errorf("build %q of template %q: %w", r.PathValue("buildID"), r.PathValue("id"), errdefs.ErrNotFound)
	}
	return bd, nil
}

func (s *Server) fileUploadLink(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		writeError(w, err)
		return
	}
	hash := r.PathValue("hash")
	if len(hash) != 64 || strings.Trim(hash, "0123456789abcdef") != "" {
		writeError(w, invalid("hash: want the 64 hex digit SHA-256 of the files"))
		return
	}
	if b.HasUpload(hash) {
		writeJSON(w, http.StatusCreated, map[string]any{"present": true})
		return
	}
	tok := make([]byte, 24)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	s.builds.mu.Lock()
	if s.builds.uploads == nil {
		s.builds.uploads = map[string]uploadGrant{}
	}
	now := time.Now()
	for k, g := range s.builds.uploads {
		if now.After(g.expires) {
			delete(s.builds.uploads, k)
		}
	}
	s.builds.uploads[token] = uploadGrant{hash: hash, expires: now.Add(uploadTokenTTL)}
	s.builds.mu.Unlock()
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	writeJSON(w, http.StatusCreated, map[string]any{
		"present": false, "url": scheme + "://" + r.Host + "/templates/uploads/" + token, "headers": map[string]string{},
	})
}

func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		writeError(w, err)
		return
	}
	token := r.PathValue("token")
	s.builds.mu.Lock()
	g, ok := s.builds.uploads[token]
	delete(s.builds.uploads, token)
	s.builds.mu.Unlock()
	if !ok || time.Now().After(g.expires) {
		writeError(w, fmt.Errorf("upload URL is unknown or expired; ask GET /templates/{id}/files/{hash} again: %w", errdefs.ErrNotFound))
		return
	}
	if err := b.PutUpload(g.hash, http.MaxBytesReader(w, r.Body, maxUploadBytes+1), maxUploadBytes); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// startBuildBody is E2B's TemplateBuildStartV2.
type startBuildBody struct {
	FromImage         string `json:"fromImage"`
	FromTemplate      string `json:"fromTemplate"`
	FromImageRegistry *struct {
		Type     string `json:"type"`
		Username string `json:"username"`
		Password string `json:"password"`
	} `json:"fromImageRegistry"`
	Force    bool    `json:"force"`
	StartCmd *string `json:"startCmd"`
	ReadyCmd *string `json:"readyCmd"`
	Steps    []struct {
		Type      string   `json:"type"`
		Args      []string `json:"args"`
		FilesHash string   `json:"filesHash"`
		Force     bool     `json:"force"`
	} `json:"steps"`
}

// e2bBaseImage is the SDK's default base image (Template() without a
// from*): agentbox's own "base" template plays its part.
const e2bBaseImage = "e2bdev/base"

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		writeError(w, err)
		return
	}
	bd, err := s.lookupBuild(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var body startBuildBody
	if err := decodeBody(w, r, 16<<20, false, &body); err != nil {
		writeError(w, err)
		return
	}
	spec, err := buildSpecOf(body, bd)
	if err != nil {
		writeError(w, err)
		return
	}
	for _, st := range spec.Steps {
		if st.FilesHash != "" && !b.HasUpload(st.FilesHash) {
			writeError(w, invalid("steps: COPY %s: files %s were not uploaded", strings.Join(st.Src, " "), st.FilesHash))
			return
		}
	}
	s.builds.mu.Lock()
	spec.Network = s.builds.network
	s.builds.mu.Unlock()
	bd.mu.Lock()
	if bd.status != "waiting" {
		bd.mu.Unlock()
		writeError(w, fmt.Errorf("build %s was started already: %w", bd.buildID, errdefs.ErrConflict))
		return
	}
	bd.status = "building"
	bd.mu.Unlock()
	// The build outlives the request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), maxBuildTime)
	go func() {
		defer cancel()
		bd.log("info", fmt.Sprintf("Building template %s:%s (%s)", bd.name, bd.tag, bd.templateID))
		tpl, err := b.BuildFromSpec(ctx, spec, bd)
		bd.finish(tpl, err)
		if err != nil {
			s.log.Warn("template build failed", "template", bd.templateID, "build", bd.buildID, "err", err)
		}
	}()
	w.WriteHeader(http.StatusAccepted)
}

// buildSpecOf maps an E2B build request onto the builder's steps.
func buildSpecOf(body startBuildBody, bd *apiBuild) (template.BuildSpec, error) {
	spec := template.BuildSpec{
		Name: bd.name, Tag: bd.tag, Tags: bd.tags, ID: bd.templateID, Force: body.Force,
		StartCmd: body.StartCmd, ReadyCmd: body.ReadyCmd, CPUCount: bd.cpuCount, MemoryMB: bd.memoryMB,
		Source: "e2b build API", BuildID: bd.buildID,
	}
	switch {
	case body.FromTemplate != "" && body.FromImage != "":
		return spec, invalid("fromImage and fromTemplate: give one")
	case body.FromTemplate != "":
		spec.From = body.FromTemplate
	case body.FromImage == "" || body.FromImage == e2bBaseImage || strings.HasPrefix(body.FromImage, e2bBaseImage+":"):
		spec.From = "base"
	default:
		spec.From, spec.FromImage = body.FromImage, true
	}
	if rc := body.FromImageRegistry; rc != nil {
		if rc.Type != "registry" {
			return spec, invalid("fromImageRegistry: type %q is not supported (only \"registry\" with username and password)", rc.Type)
		}
		spec.Auth = &template.RegistryAuth{Username: rc.Username, Password: rc.Password}
	}
	if len(body.Steps) > 500 {
		return spec, invalid("steps: at most 500")
	}
	for i, st := range body.Steps {
		bad := func(msg string) error { return invalid("steps[%d] (%s): %s", i, st.Type, msg) }
		step := template.Step{Line: i + 1, Force: st.Force}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || strings.TrimSpace(st.Args[0]) == "" {
				return spec, bad("want a command")
			}
			step.Op, step.Args = template.OpRun, st.Args[:1]
			if len(st.Args) > 1 {
				step.User = st.Args[1]
			}
		case "COPY":
			if len(st.Args) < 2 || st.FilesHash == "" {
				return spec, bad("want source, destination and filesHash")
			}
			step.Op, step.Src, step.Dest, step.FilesHash = template.OpCopy, []string{st.Args[0]}, st.Args[1], st.FilesHash
			if len(st.Args) > 2 {
				step.User = st.Args[2]
			}
			if len(st.Args) > 3 {
				step.Mode = st.Args[3]
			}
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return spec, bad("want key, value pairs")
			}
			step.Op, step.Args = template.OpEnv, st.Args
		case "WORKDIR", "USER":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return spec, bad("want one value")
			}
			step.Op, step.Args = st.Type, st.Args
		default:
			return spec, bad("unknown step type")
		}
		spec.Steps = append(spec.Steps, step)
	}
	return spec, nil
}

// Write receives the builder's progress output and turns it into log entries.
func (bd *apiBuild) Write(p []byte) (int, error) {
	bd.mu.Lock()
	text := bd.partial + string(p)
	bd.mu.Unlock()
	lines := strings.Split(text, "\n")
	bd.mu.Lock()
	bd.partial = lines[len(lines)-1]
	bd.mu.Unlock()
	for _, l := range lines[:len(lines)-1] {
		if rest, ok := strings.CutPrefix(l, "==> ["); ok {
			if n, _, ok := strings.Cut(rest, "/"); ok {
				bd.mu.Lock()
				bd.step = n
				bd.mu.Unlock()
			}
		}
		bd.log("info", l)
	}
	return len(p), nil
}

func (bd *apiBuild) log(level, msg string) {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	bd.logs = append(bd.logs, buildLogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: bd.step})
	if over := len(bd.logs) - maxLogEntries; over > 0 {
		bd.logs = bd.logs[over:]
		bd.dropped += over
	}
}

func (bd *apiBuild) finish(tpl *template.Template, err error) {
	if err == nil {
		bd.log("info", fmt.Sprintf("Template %s:%s is ready (%s)", bd.name, bd.tag, tpl.ID))
	} else {
		bd.log("error", "Build failed: "+err.Error())
	}
	bd.mu.Lock()
	defer bd.mu.Unlock()
	if err == nil {
		bd.status = "ready"
		return
	}
	bd.status = "error"
	reason := &buildReason{Message: err.Error(), LogEntries: []buildLogEntry{}}
	var be *template.BuildError
	if errors.As(err, &be) {
		reason.Step = strconv.Itoa(be.Step)
	}
	reason.LogEntries = append(reason.LogEntries, bd.logs[max(0, len(bd.logs)-20):]...)
	bd.reason = reason
}

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	bd, err := s.lookupBuild(r)
	if err != nil {
		writeError(w, err)
		return
	}
	offset, _ := strconv.Atoi(r.URL.Query().Get("logsOffset"))
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	level := r.URL.Query().Get("level")
	bd.mu.Lock()
	defer bd.mu.Unlock()
	entries := []buildLogEntry{}
	// Offsets count every entry ever logged, also dropped ones.
	for i := max(offset-bd.dropped, 0); i < len(bd.logs) && len(entries) < limit; i++ {
		if level == "" || bd.logs[i].Level == level {
			entries = append(entries, bd.logs[i])
		}
	}
	out := map[string]any{
		"templateID": bd.templateID, "buildID": bd.buildID, "status": bd.status,
		"logEntries": entries, "logs": []string{},
	}
	if bd.reason != nil {
		out["reason"] = bd.reason
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	bd, err := s.lookupBuild(r)
	if err != nil {
		writeError(w, err)
		return
	}
	bd.mu.Lock()
	defer bd.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"logs": append([]buildLogEntry{}, bd.logs...)})
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if s.deleteSnapshot(w, r) { // snapshots are templates to the SDK (lifecycle.go)
		return
	}
	b, err := s.builder()
	if err != nil {
		writeError(w, err)
		return
	}
	t, err := s.templates.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := b.Delete(r.Context(), t.ID); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) templateGC(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := b.GC(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) templateUsage(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		writeError(w, err)
		return
	}
	u, err := b.DiskUsage(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, u)
}
