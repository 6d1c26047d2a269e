package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/volume"
)

// SetVolumes enables the volume routes (/volumes and the volume content
// API). Without it they answer 503. Call before serving.
func (s *Server) SetVolumes(v *volume.Service) { s.vols = v }

// volumeRoutes serves E2B's volume API: the team's volumes under the API
// key, and each volume's files under the volume's own content token
// (/volumecontent, which E2B's SDKs reach at E2B_VOLUME_API_URL).
func (s *Server) volumeRoutes(mux *http.ServeMux, auth func(pattern string, h http.HandlerFunc)) {
	vol := func(pattern string, h http.HandlerFunc) {
		auth(pattern, func(w http.ResponseWriter, r *http.Request) {
			if !s.volumesOff(w) {
				h(w, r)
			}
		})
	}
	vol("GET /volumes", s.listVolumes)
	vol("POST /volumes", s.createVolume)
	vol("GET /volumes/{volumeID}", s.getVolume)
	vol("DELETE /volumes/{volumeID}", s.deleteVolume)
	content := func(pattern string, h volumeHandler) { mux.Handle(pattern, s.volumeToken(h)) }
	content("GET /volumecontent/{volumeID}/dir", s.volumeList)
	content("POST /volumecontent/{volumeID}/dir", s.volumeMakeDir)
	content("GET /volumecontent/{volumeID}/file", s.volumeRead)
	content("PUT /volumecontent/{volumeID}/file", s.volumeWrite)
	content("GET /volumecontent/{volumeID}/path", s.volumeStat)
	content("DELETE /volumecontent/{volumeID}/path", s.volumeRemove)
	content("PATCH /volumecontent/{volumeID}/path", s.volumeSetMeta)
}

func (s *Server) volumesOff(w http.ResponseWriter) bool {
	if s.vols == nil {
		httperr.Write(w, fmt.Errorf("volumes are not enabled on this server: %w", errdefs.ErrUnavailable))
		return true
	}
	return false
}

func volumeOf(v store.Volume) rest.Volume {
	return rest.Volume{VolumeID: v.ID, Name: v.Name, SizeMB: v.SizeMB}
}

func (s *Server) withToken(v store.Volume) rest.VolumeAndToken {
	return rest.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: s.vols.Token(v), SizeMB: v.SizeMB}
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vols, err := s.vols.List(r.Context(), keyOf(r.Context()).TeamID)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := make([]rest.Volume, 0, len(vols))
	for _, v := range vols {
		out = append(out, volumeOf(v))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var body rest.NewVolume
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	if body.SizeMB < 0 {
		httperr.Write(w, invalid("sizeMB: must be positive, got %d", body.SizeMB))
		return
	}
	key := keyOf(r.Context())
	v, err := s.vols.Create(detach(r.Context(), r), key.TeamID, body.Name, body.SizeMB)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	s.auditVolume(r.Context(), key, audit.Event{Kind: audit.KindLifecycle, Action: "volume-create",
		Fields: map[string]any{"volumeID": v.ID, "name": v.Name, "sizeMB": v.SizeMB}})
	httperr.WriteJSON(w, http.StatusCreated, s.withToken(v))
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.vols.Get(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("volumeID"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, s.withToken(v))
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	key := keyOf(r.Context())
	id := r.PathValue("volumeID")
	if err := s.vols.Delete(detach(r.Context(), r), key.TeamID, id); err != nil {
		httperr.Write(w, err)
		return
	}
	s.auditVolume(r.Context(), key, audit.Event{Kind: audit.KindLifecycle, Action: "volume-delete", Fields: map[string]any{"volumeID": id}})
	w.WriteHeader(http.StatusNoContent)
}

// auditVolume records e, an event of the team's volumes rather than of a
// sandbox, as done with key.
func (s *Server) auditVolume(ctx context.Context, key store.APIKey, e audit.Event) {
	e.TeamID, e.APIKeyID = key.TeamID, key.ID
	s.record(ctx, e)
}

// ---- sandbox creates ----

// maxVolumeMounts is the most volumes one sandbox mounts.
const maxVolumeMounts = 16

// reservedMountPaths are the paths a volume may not cover: the kernel's
// file systems, the server's files in the sandbox, and the root.
var reservedMountPaths = []string{"/proc", "/sys", "/dev", "/.agentbox", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// volumeMounts validates a create's volumeMounts, naming the field of the
// first problem. Names are resolved in the team later (the manager).
func volumeMounts(in []rest.SandboxVolumeMount) ([]sandbox.VolumeMount, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(in) > maxVolumeMounts {
		return nil, invalid("volumeMounts: %d mounts is over the limit of %d", len(in), maxVolumeMounts)
	}
	out := make([]sandbox.VolumeMount, 0, len(in))
	for i, m := range in {
		field := fmt.Sprintf("volumeMounts[%d]", i)
		if err := volume.CheckName(field+".name", m.Name); err != nil {
			return nil, err
		}
		p := m.Path
		switch {
		case p == "":
			return nil, invalid("%s.path: required, an absolute path such as /workspace", field)
		case len(p) > 1024 || !printable(p):
			return nil, invalid("%s.path: must be printable and at most 1024 bytes", field)
		case !strings.HasPrefix(p, "/"):
			return nil, invalid("%s.path: %q must be absolute", field, apireq.Truncate(p))
		case path.Clean(p) != p:
			return nil, invalid("%s.path: %q must be clean: no '.' or '..' components, repeated or trailing '/' (%q)", field, apireq.Truncate(p), path.Clean(p))
		case p == "/":
			return nil, invalid("%s.path: a volume cannot be mounted over the sandbox's root", field)
		}
		for _, r := range reservedMountPaths {
			if p == r || strings.HasPrefix(p, r+"/") {
				return nil, invalid("%s.path: %s is the sandbox's own (%s); choose another path such as /workspace", field, p, r)
			}
		}
		for j, o := range out {
			if o.Path == p {
				return nil, invalid("%s.path: %s is also the path of volumeMounts[%d]", field, p, j)
			}
			if strings.HasPrefix(p, o.Path+"/") || strings.HasPrefix(o.Path, p+"/") {
				return nil, invalid("%s.path: %s and the path of volumeMounts[%d], %s, are inside one another; mount volumes side by side", field, p, j, o.Path)
			}
		}
		out = append(out, sandbox.VolumeMount{Name: m.Name, Path: p})
	}
	return out, nil
}

// mountsOf is the wire form of a sandbox's mounts (nil when none).
func mountsOf(sb *sandbox.Sandbox) []rest.SandboxVolumeMount {
	if len(sb.VolumeMounts) == 0 {
		return nil
	}
	out := make([]rest.SandboxVolumeMount, len(sb.VolumeMounts))
	for i, v := range sb.VolumeMounts {
		out[i] = rest.SandboxVolumeMount{Name: v.Name, Path: v.Path}
	}
	return out
}

// ---- the volume content API ----

type volumeHandler func(w http.ResponseWriter, r *http.Request, f *volume.Files)

// volumeToken authorises a content call by the volume's token (Bearer),
// counting wrong tokens against the client like wrong API keys, and opens
// the volume's files for h.
func (s *Server) volumeToken(h volumeHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.volumesOff(w) {
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			httperr.Write(w, fmt.Errorf("missing volume token: send Authorization: Bearer <token> (VolumeAndToken.token of GET /volumes/{volumeID}): %w", errdefs.ErrUnauthenticated))
			return
		}
		var v store.Volume
		if !s.checkSecret(w, r, "volume token", tok, func() (err error) {
			v, err = s.vols.Authorize(r.Context(), r.PathValue("volumeID"), tok)
			return err
		}) {
			return
		}
		f, err := s.vols.Files(r.Context(), v)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		defer f.Close()
		h(w, r, f)
	})
}

// entryOf is the wire form of a volume entry.
func entryOf(e volume.Entry) rest.VolumeEntryStat {
	return rest.VolumeEntryStat{Name: e.Name, Type: e.Type, Path: e.Path, Size: e.Size, Mode: e.Mode, UID: e.UID, GID: e.GID,
		Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target}
}

// uintParam reads an optional unsigned query parameter.
func uintParam(q url.Values, name string) (*uint32, error) {
	v := q.Get(name)
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return nil, invalid("%s: must be a non-negative integer, got %q", name, apireq.Truncate(v))
	}
	u := uint32(n)
	return &u, nil
}

// boolParam reads an optional true/false query parameter.
func boolParam(q url.Values, name string) (bool, error) {
	switch v := q.Get(name); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, invalid("%s: must be true or false, got %q", name, apireq.Truncate(v))
	}
}

// metaParams reads uid, gid and mode from the query.
func metaParams(q url.Values) (volume.Meta, error) {
	var m volume.Meta
	var err error
	if m.UID, err = uintParam(q, "uid"); err != nil {
		return m, err
	}
	if m.GID, err = uintParam(q, "gid"); err != nil {
		return m, err
	}
	if m.Mode, err = uintParam(q, "mode"); err != nil {
		return m, err
	}
	return m, m.Check()
}

// pathParam is the required path query parameter.
func pathParam(q url.Values) (string, error) {
	if _, ok := q["path"]; !ok {
		return "", invalid("path: required, e.g. ?path=/file.txt")
	}
	return q.Get("path"), nil
}

func (s *Server) volumeList(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	q := r.URL.Query()
	p, err := pathParam(q)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	depth := 1
	if v := q.Get("depth"); v != "" {
		if depth, err = strconv.Atoi(v); err != nil {
			httperr.Write(w, invalid("depth: must be an integer from 1 to %d, got %q", volume.MaxDepth, apireq.Truncate(v)))
			return
		}
	}
	// The listing is streamed as it is read, so a large tree costs no
	// memory; the first entry commits to 200.
	started := false
	enc := json.NewEncoder(w)
	err = f.List(p, depth, func(e volume.Entry) error {
		if !started {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("["))
			started = true
		} else {
			_, _ = w.Write([]byte(","))
		}
		return enc.Encode(entryOf(e))
	})
	switch {
	case err != nil && !started:
		httperr.Write(w, err)
	case err != nil:
		s.log.Warn("volume listing cut off", "err", err)
		// The array stays unterminated: the client sees invalid JSON,
		// not a short listing.
	case !started:
		httperr.WriteJSON(w, http.StatusOK, []rest.VolumeEntryStat{})
	default:
		_, _ = w.Write([]byte("]\n"))
	}
}

// creationParams are the query parameters of the calls that make an
// entry: its path, owner and mode, and force.
func creationParams(q url.Values) (p string, m volume.Meta, force bool, err error) {
	if p, err = pathParam(q); err != nil {
		return
	}
	if m, err = metaParams(q); err != nil {
		return
	}
	force, err = boolParam(q, "force")
	return
}

func (s *Server) volumeMakeDir(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, m, force, err := creationParams(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	e, err := f.MakeDir(p, m, force)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, entryOf(e))
}

func (s *Server) volumeRead(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, err := pathParam(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	fd, e, err := f.Open(p)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	defer fd.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", e.Mtime, fd)
}

func (s *Server) volumeWrite(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, m, force, err := creationParams(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	e, err := f.Write(p, r.Body, m, force)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, entryOf(e))
}

func (s *Server) volumeStat(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, err := pathParam(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	e, err := f.Stat(p)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, entryOf(e))
}

func (s *Server) volumeRemove(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, err := pathParam(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if err := f.Remove(p); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) volumeSetMeta(w http.ResponseWriter, r *http.Request, f *volume.Files) {
	p, err := pathParam(r.URL.Query())
	if err != nil {
		httperr.Write(w, err)
		return
	}
	var body rest.VolumeMetadata
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	e, err := f.SetMeta(p, volume.Meta{UID: body.UID, GID: body.GID, Mode: body.Mode})
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, entryOf(e))
}
