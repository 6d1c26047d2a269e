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

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/template"
)

// TemplateBuilder is what the build API needs from the template store
// beyond Templates; the API finds it on the store it was given. Every call
// names the team asking.
type TemplateBuilder interface {
	Delete(ctx context.Context, team, ref string) error
	HasUpload(team, hash string) bool
	PutUpload(team, hash string, r io.Reader, maxBytes int64, digestMustMatch bool) (template.Upload, error)
	CheckUploadRoom(team string, size int64) error
}

// Limits of the build API.
const uploadTokenTTL = time.Hour

// UploadLinksPerTeam is the default of how many upload links one team may
// hold unused at once (--upload-links-per-team).
const UploadLinksPerTeam = 64

// uploadGrants are the one-time upload links handed out: each is for one
// team and one files hash. Links are capped per team, here and nowhere
// else: an unused link expires after uploadTokenTTL.
type uploadGrants struct {
	mu      sync.Mutex
	perTeam int                    // 0: UploadLinksPerTeam
	grants  map[string]uploadGrant // by token
}

// SetUploadLinksPerTeam sets how many unused upload links a team may hold;
// call before serving.
func (s *Server) SetUploadLinksPerTeam(n int) { s.uploads.perTeam = n }

// issue hands out a new link for team's upload of hash, refusing it when
// the team holds its cap of unused links.
func (u *uploadGrants) issue(team, hash string, verify bool, now time.Time) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.grants == nil {
		u.grants = map[string]uploadGrant{}
	}
	held := 0
	for k, g := range u.grants {
		switch {
		case now.After(g.expires):
			delete(u.grants, k)
		case g.team == team:
			held++
		}
	}
	limit := u.perTeam
	if limit <= 0 {
		limit = UploadLinksPerTeam
	}
	if held >= limit {
		return "", fmt.Errorf("upload links: the team holds %d unused upload links, the most this server allows (agentbox serve --upload-links-per-team); upload to them or wait until they expire (%s after they were made): %w",
			held, uploadTokenTTL, errdefs.ErrResourceExhausted)
	}
	tok := make([]byte, 24) // 192 random bits: never guessed
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	u.grants[token] = uploadGrant{team: team, hash: hash, verify: verify, expires: now.Add(uploadTokenTTL)}
	return token, nil
}

type uploadGrant struct {
	team, hash string
	verify     bool // the hash must be the SHA-256 of the bytes (agentbox clients)
	expires    time.Time
}

// SetBuilds gives the API the builder's job runner (template.Builds).
// Without it the build API answers 503. Call before serving.
func (s *Server) SetBuilds(b *template.Builds) { s.builds = b }

func (s *Server) builder() (TemplateBuilder, error) {
	b, ok := s.templates.(TemplateBuilder)
	if !ok {
		return nil, fmt.Errorf("this server cannot build templates: %w", errdefs.ErrUnavailable)
	}
	return b, nil
}

func (s *Server) jobs() (*template.Builds, error) {
	if s.builds == nil {
		return nil, fmt.Errorf("this server cannot build templates: %w", errdefs.ErrUnavailable)
	}
	return s.builds, nil
}

// operatorOnly answers a store-wide route that is not a team's to call.
func operatorOnly(cmd string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		httperr.Write(w, fmt.Errorf("%s %s acts on every team's templates: it is an operator command now, run `agentbox %s` on the server: %w",
			r.Method, r.URL.Path, cmd, errdefs.ErrNotFound))
	}
}

// templateBuildRoutes registers the E2B template build API and template
// deletion. Store-wide GC and disk usage are operator commands, not routes.
func (s *Server) templateBuildRoutes(mux *http.ServeMux, auth func(string, http.HandlerFunc)) {
	auth("POST /v3/templates", s.requestBuild)
	auth("GET /templates/{id}/files/{hash}", s.fileUploadLink)
	auth("POST /v2/templates/{id}/builds/{buildID}", s.startBuild)
	auth("GET /templates/{id}/builds/{buildID}/status", s.buildStatus)
	auth("GET /templates/{id}/builds/{buildID}/logs", s.buildLogs)
	auth("DELETE /templates/{id}", s.deleteTemplate)
	auth("POST /templates/gc", operatorOnly("template gc"))
	auth("GET /templates/usage", operatorOnly("template usage"))
	s.templateTagRoutes(auth)
	// The upload URL carries a one-time token instead of the API key: the
	// SDK PUTs to it without its usual headers.
	mux.HandleFunc("PUT /templates/uploads/{token}", s.uploadFiles)
}

var aliasPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	jobs, err := s.jobs()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	var b rest.TemplateBuildRequestV3
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &b); err != nil {
		httperr.Write(w, err)
		return
	}
	ref := b.Name
	if ref == "" {
		ref = b.Alias
	}
	name, tag, _ := strings.Cut(ref, ":")
	if !aliasPattern.MatchString(name) {
		httperr.Write(w, invalid("name: %q is not a valid template name (lowercase letters, digits, '.', '_', '-'; optional :tag)", ref))
		return
	}
	if tag == "" {
		tag = "default"
	}
	for _, t := range append([]string{tag}, b.Tags...) {
		if !aliasPattern.MatchString(strings.ToLower(t)) {
			httperr.Write(w, invalid("tags: %q is not a valid tag", t))
			return
		}
	}
	if b.CPUCount < 0 || b.CPUCount > 64 || b.MemoryMB < 0 || b.MemoryMB > 1<<20 {
		httperr.Write(w, invalid("cpuCount/memoryMB out of range"))
		return
	}
	team := keyOf(r.Context()).TeamID
	j, err := jobs.Request(r.Context(), team, template.BuildRequest{Name: name, Tag: tag, Tags: b.Tags, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB})
	if err != nil {
		if !errors.Is(err, errdefs.ErrResourceExhausted) {
			err = fmt.Errorf("name: %w", err)
		}
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusAccepted, rest.TemplateRequestResponseV3{
		TemplateID: j.TemplateID, BuildID: j.BuildID, Names: []string{name + ":" + tag},
		Tags: append([]string{tag}, b.Tags...), Aliases: []string{name}, Public: false,
	})
}

// ownsTemplateID reports whether team owns template id or has a build
// under way for it (the first build of a name has no template yet).
func (s *Server) ownsTemplateID(r *http.Request, id string) bool {
	team := keyOf(r.Context()).TeamID
	if t, err := s.templates.Get(r.Context(), team, id); err == nil && t.ID == id && t.OwnedBy(team) {
		return true
	}
	return s.builds != nil && s.builds.HasTemplate(team, id)
}

func (s *Server) fileUploadLink(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	id, hash := r.PathValue("id"), r.PathValue("hash")
	if !s.ownsTemplateID(r, id) {
		httperr.Write(w, fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound))
		return
	}
	if len(hash) != 64 || strings.Trim(hash, "0123456789abcdef") != "" {
		httperr.Write(w, invalid("hash: want the 64 hex digit SHA-256 of the files"))
		return
	}
	team := keyOf(r.Context()).TeamID
	if b.HasUpload(team, hash) {
		httperr.WriteJSON(w, http.StatusCreated, rest.TemplateBuildFileUpload{Present: true})
		return
	}
	token, err := s.uploads.issue(team, hash, r.URL.Query().Get("verify") == "sha256", time.Now())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	httperr.WriteJSON(w, http.StatusCreated, rest.TemplateBuildFileUpload{
		Present: false, URL: scheme + "://" + r.Host + "/templates/uploads/" + token, Headers: &map[string]string{},
	})
}

func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	b, err := s.builder()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	token := r.PathValue("token")
	s.uploads.mu.Lock()
	g, ok := s.uploads.grants[token]
	delete(s.uploads.grants, token)
	s.uploads.mu.Unlock()
	if !ok || time.Now().After(g.expires) {
		httperr.Write(w, fmt.Errorf("upload URL is unknown or expired; ask GET /templates/{id}/files/{hash} again: %w", errdefs.ErrNotFound))
		return
	}
	if r.ContentLength > 0 {
		// A declared size past the quota is refused before a byte is read
		// (PutUpload counts the bytes themselves as they come).
		if err := b.CheckUploadRoom(g.team, r.ContentLength); err != nil {
			httperr.Write(w, err)
			return
		}
	}
	if _, err := b.PutUpload(g.team, g.hash, http.MaxBytesReader(w, r.Body, template.MaxUploadBytes+1), template.MaxUploadBytes, g.verify); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// e2bBaseImage is the SDK's default base image (Template() without a
// from*): agentbox's own "base" template plays its part.
const e2bBaseImage = "e2bdev/base"

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	jobs, err := s.jobs()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	var body rest.TemplateBuildStartV2
	if err := apireq.DecodeJSON(w, r, 16<<20, false, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	spec, err := buildSpecOf(body)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if err := jobs.Start(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("id"), r.PathValue("buildID"), spec); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// buildSpecOf maps an E2B build request onto the builder's steps; the
// builder adds the job's name, team and IDs.
func buildSpecOf(body rest.TemplateBuildStartV2) (template.BuildSpec, error) {
	spec := template.BuildSpec{
		Force: body.Force, StartCmd: body.StartCmd, ReadyCmd: body.ReadyCmd, Source: "e2b build API",
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
		// agentbox extensions (the CLI's Dockerfile builds): EXPOSE ports;
		// CMD and ENTRYPOINT as argv (shell form as /bin/sh -c); READY one
		// shell command (HEALTHCHECK CMD).
		case "EXPOSE":
			if len(st.Args) == 0 {
				return spec, bad("want ports")
			}
			step.Op, step.Args = template.OpExpose, st.Args
		case "CMD", "ENTRYPOINT":
			if len(st.Args) == 0 {
				return spec, bad("want a command as argv")
			}
			step.Op, step.Args, step.Exec = st.Type, st.Args, true
		case "READY":
			if len(st.Args) != 1 || strings.TrimSpace(st.Args[0]) == "" {
				return spec, bad("want one shell command")
			}
			step.Op, step.Args = template.OpReady, st.Args
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

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	jobs, err := s.jobs()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	offset, _ := strconv.Atoi(r.URL.Query().Get("logsOffset"))
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	st, err := jobs.Status(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("id"), r.PathValue("buildID"), offset, limit, r.URL.Query().Get("level"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, buildInfo(st))
}

func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	jobs, err := s.jobs()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	logs, err := jobs.Logs(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("id"), r.PathValue("buildID"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, rest.TemplateBuildLogsResponse{Logs: buildLog(logs)})
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if s.mgr != nil && s.deleteSnapshot(w, r) { // snapshots are templates to the SDK (lifecycle.go)
		return
	}
	b, err := s.builder()
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if err := b.Delete(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("id")); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
