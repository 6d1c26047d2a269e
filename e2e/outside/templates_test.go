package outside

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// templateBuild drives the E2B build API as the SDK does: request, upload
// each COPY context, start, wait. It returns the template and build IDs
// and the final status body.
type templateBuild struct {
	t                   *testing.T
	s                   *target
	key                 string
	ctx                 context.Context
	templateID, buildID string
}

func requestBuild(ctx context.Context, t *testing.T, s *target, key, name string) (*templateBuild, error) {
	st, b, err := s.Do(ctx, key, http.MethodPost, "/v3/templates", map[string]any{"name": name})
	if err != nil {
		return nil, err
	}
	if st != http.StatusAccepted {
		return nil, fmt.Errorf("request build %s: %d %s", name, st, b)
	}
	return &templateBuild{t: t, s: s, key: key, ctx: ctx, templateID: jsonField(t, b, "templateID"), buildID: jsonField(t, b, "buildID")}, nil
}

// upload asks for an upload link for hash (verify adds ?verify=sha256) and
// PUTs body; it returns the PUT's status and body.
func (tb *templateBuild) upload(hash string, body []byte, verify bool) (int, []byte, error) {
	path := "/templates/" + tb.templateID + "/files/" + hash
	if verify {
		path += "?verify=sha256"
	}
	st, b, err := tb.s.Do(tb.ctx, tb.key, http.MethodGet, path, nil)
	if err != nil {
		return 0, nil, err
	}
	if st != http.StatusCreated {
		return st, b, fmt.Errorf("upload link: %d %s", st, b)
	}
	var link struct {
		Present bool
		URL     string
	}
	if err := json.Unmarshal(b, &link); err != nil {
		return 0, nil, err
	}
	if link.Present {
		return http.StatusOK, nil, nil
	}
	req, err := http.NewRequestWithContext(tb.ctx, http.MethodPut, link.URL, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes(), nil
}

// run starts the build with steps and waits for it to end: it returns
// "ready" or the failure's message.
func (tb *templateBuild) run(from string, steps []map[string]any) (string, error) {
	path := "/templates/" + tb.templateID + "/builds/" + tb.buildID
	st, b, err := tb.s.Do(tb.ctx, tb.key, http.MethodPost, "/v2"+path, map[string]any{"fromTemplate": from, "steps": steps})
	if err != nil {
		return "", err
	}
	if st != http.StatusAccepted {
		return fmt.Sprintf("start refused: %d %s", st, b), nil
	}
	return tb.wait()
}

// wait waits for the started build to end: it returns "ready" or the
// failure's message.
func (tb *templateBuild) wait() (string, error) {
	path := "/templates/" + tb.templateID + "/builds/" + tb.buildID
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		_, b, err := tb.s.Do(tb.ctx, tb.key, http.MethodGet, path+"/status", nil)
		if err != nil {
			return "", err
		}
		var status struct {
			Status string
			Reason *struct{ Message string }
		}
		if err := json.Unmarshal(b, &status); err != nil {
			return "", fmt.Errorf("status: %v: %s", err, b)
		}
		switch status.Status {
		case "ready":
			return "ready", nil
		case "error":
			if status.Reason != nil {
				return status.Reason.Message, nil
			}
			return "error", nil
		}
	}
	return "", fmt.Errorf("build %s did not end", tb.buildID)
}

func tarOf(entries ...tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := []byte(h.Linkname)
		if h.Typeflag == tar.TypeReg {
			h.Size, h.Linkname = int64(len(body)), ""
		}
		_ = tw.WriteHeader(&h)
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write(body)
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

// TestTemplateAttacks: another team against team A's templates, builds and
// uploads through every template route, and the author of a build's
// Dockerfile and context against the host.
func TestTemplateAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// Team A builds a private template from base with a COPY of a secret.
	a, err := requestBuild(ctx, t, s, s.APIKey, "outside-private:v1")
	if err != nil {
		t.Fatal(err)
	}
	secret := tarOf(tar.Header{Name: "secret.txt", Typeflag: tar.TypeReg, Mode: 0o600, Linkname: "team-a-secret"})
	aHash := strings.Repeat("a7", 32)
	if st, b, err := a.upload(aHash, secret, false); err != nil || st != http.StatusOK {
		t.Fatalf("team A uploads: %d %s %v", st, b, err)
	}
	if res, err := a.run("base", []map[string]any{
		{"type": "COPY", "args": []string{"secret.txt", "/opt/"}, "filesHash": aHash},
		{"type": "ENV", "args": []string{"OWNER", "team-a"}},
	}); err != nil || res != "ready" {
		t.Fatalf("team A's build: %s %v", res, err)
	}
	t.Cleanup(func() {
		_, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/templates/"+a.templateID, nil)
	})
	aInfo := func() (int, []byte) {
		st, b, _ := s.Do(ctx, s.APIKey, http.MethodGet, "/templates/"+a.templateID, nil)
		return st, b
	}
	_, before := aInfo()
	intact := func() error {
		st, b := aInfo()
		if st != http.StatusOK {
			return crossed("team A's template is gone after the attack: %d %s", st, b)
		}
		if !bytes.Equal(b, before) {
			return crossed("team A's template changed: %.200s", b)
		}
		return nil
	}
	const unknownID = "t0000000000000000000"
	buildPath := "/templates/" + a.templateID + "/builds/" + a.buildID
	// sameAsUnknown: the answer to team B for A's object must be the
	// answer for an object that does not exist (404, same body).
	sameAsUnknown := func(method, path, unknownPath string, body any) error {
		st, b, err := s.Do(ctx, s.OtherKey, method, path, body)
		if err != nil {
			return err
		}
		ust, ub, err := s.Do(ctx, s.OtherKey, method, unknownPath, body)
		if err != nil {
			return err
		}
		switch {
		case st/100 == 2:
			return crossed("answered %d %.120s", st, b)
		case st != http.StatusNotFound:
			return crossed("answered %d (not 404): %.120s", st, b)
		case ust != st || !bytes.Equal(bytes.ReplaceAll(b, []byte(a.templateID), []byte(unknownID)), ub):
			return crossed("answer differs from an unknown template's: %.120s vs %.120s", b, ub)
		}
		return intact()
	}
	attacks := []attack{
		{sideTenant, "other team GET /templates/{A's id}", func(t *testing.T) error {
			return sameAsUnknown(http.MethodGet, "/templates/"+a.templateID, "/templates/"+unknownID, nil)
		}},
		{sideTenant, "other team resolves A's template name", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/templates/aliases/outside-private", nil)
			if err != nil {
				return err
			}
			if st != http.StatusNotFound {
				return crossed("answered %d %.120s", st, b)
			}
			return nil
		}},
		{sideTenant, "other team tags A's template", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/templates/tags", map[string]any{"target": a.templateID, "tags": []string{"pwned"}})
			if err != nil {
				return err
			}
			if st != http.StatusNotFound {
				return crossed("answered %d %.120s", st, b)
			}
			return intact()
		}},
		{sideTenant, "other team untags A's name", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodDelete, "/templates/tags", map[string]any{"name": "outside-private", "tags": []string{"v1"}})
			if err != nil {
				return err
			}
			if st != http.StatusNotFound {
				return crossed("answered %d %.120s", st, b)
			}
			return intact()
		}},
		{sideTenant, "other team DELETE /templates/{A's id}", func(t *testing.T) error {
			return sameAsUnknown(http.MethodDelete, "/templates/"+a.templateID, "/templates/"+unknownID, nil)
		}},
		{sideTenant, "other team reads A's build status", func(t *testing.T) error {
			return sameAsUnknown(http.MethodGet, buildPath+"/status", "/templates/"+unknownID+"/builds/"+a.buildID+"/status", nil)
		}},
		{sideTenant, "other team reads A's build logs", func(t *testing.T) error {
			return sameAsUnknown(http.MethodGet, buildPath+"/logs", "/templates/"+unknownID+"/builds/"+a.buildID+"/logs", nil)
		}},
		{sideTenant, "other team starts a build on A's build ID", func(t *testing.T) error {
			body := map[string]any{"fromTemplate": "base", "steps": []map[string]any{}}
			return sameAsUnknown(http.MethodPost, "/v2"+buildPath, "/v2/templates/"+unknownID+"/builds/"+a.buildID, body)
		}},
		{sideTenant, "other team gets an upload link on A's template", func(t *testing.T) error {
			return sameAsUnknown(http.MethodGet, "/templates/"+a.templateID+"/files/"+aHash, "/templates/"+unknownID+"/files/"+aHash, nil)
		}},
		{sideTenant, "other team probes A's uploaded files hash", func(t *testing.T) error {
			b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-probe")
			if err != nil {
				return err
			}
			st, body, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/templates/"+b.templateID+"/files/"+aHash, nil)
			if err != nil {
				return err
			}
			if st != http.StatusCreated || !strings.Contains(string(body), `"present":false`) {
				return crossed("answered %d %.120s", st, body)
			}
			// And cannot build from it without uploading.
			res, err := b.run("base", []map[string]any{{"type": "COPY", "args": []string{"secret.txt", "/"}, "filesHash": aHash}})
			if err != nil {
				return err
			}
			if res == "ready" {
				return crossed("a build COPYing team A's upload by its hash succeeded")
			}
			return nil
		}},
		{sideTenant, "other team builds over A's template name", func(t *testing.T) error {
			b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-private:v1")
			if err != nil {
				return err
			}
			if b.templateID == a.templateID {
				return crossed("team B's build of the same name got team A's template ID %s", a.templateID)
			}
			res, err := b.run("base", []map[string]any{{"type": "ENV", "args": []string{"OWNER", "team-b"}}})
			if err != nil {
				return err
			}
			if res != "ready" {
				return fmt.Errorf("team B's own build failed: %s", res)
			}
			_, _, _ = s.Do(ctx, s.OtherKey, http.MethodDelete, "/templates/"+b.templateID, nil)
			return intact()
		}},
		{sideTenant, "other team builds a template named base", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v3/templates", map[string]any{"name": "base"})
			if err != nil {
				return err
			}
			if st/100 == 2 {
				return crossed("answered %d %.120s", st, b)
			}
			if !strings.Contains(string(b), "reserved") {
				return fmt.Errorf("refused without the reason: %d %s", st, b)
			}
			return nil
		}},
		{sideTenant, "other team builds FROM A's private template", func(t *testing.T) error {
			b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-from")
			if err != nil {
				return err
			}
			res, err := b.run(a.templateID, []map[string]any{{"type": "ENV", "args": []string{"X", "y"}}})
			if err != nil {
				return err
			}
			if res == "ready" {
				_, _, _ = s.Do(ctx, s.OtherKey, http.MethodDelete, "/templates/"+b.templateID, nil)
				return crossed("team B built on team A's private template")
			}
			return nil
		}},
		{sideTenant, "other team creates a sandbox from A's private template", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": a.templateID, "timeout": 60})
			if err != nil {
				return err
			}
			if st/100 == 2 {
				_, _, _ = s.Do(ctx, s.OtherKey, http.MethodDelete, "/sandboxes/"+jsonField(t, b, "sandboxID"), nil)
				return crossed("created a sandbox: %.120s", b)
			}
			ust, ub, _ := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": unknownID, "timeout": 60})
			if ust != st || !bytes.Equal(bytes.ReplaceAll(b, []byte(a.templateID), []byte(unknownID)), ub) {
				return crossed("refusal differs from an unknown template's: %d %.120s vs %d %.120s", st, b, ust, ub)
			}
			return nil
		}},
		{sideTenant, "other team runs store-wide template GC", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/templates/gc", nil)
			if err != nil {
				return err
			}
			if st/100 == 2 {
				return crossed("answered %d %.120s", st, b)
			}
			return intact()
		}},
		{sideTenant, "other team reads store-wide template usage", func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/templates/usage", nil)
			if err != nil {
				return err
			}
			if st/100 == 2 {
				return crossed("answered %d %.120s", st, b)
			}
			return nil
		}},
		{sideTenant, "other team lists A's template", func(t *testing.T) error {
			_, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/templates", nil)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte(a.templateID)) {
				return crossed("GET /templates lists team A's template")
			}
			return nil
		}},
	}

	// The build author's side: a hostile context and a lying hash.
	buildAttack := func(name string, entries []tar.Header, steps func(hash string) []map[string]any, check func(res string) error) attack {
		return attack{sideBuild, name, func(t *testing.T) error {
			b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-hostile")
			if err != nil {
				return err
			}
			body := tarOf(entries...)
			sum := sha256.Sum256(body)
			hash := hex.EncodeToString(sum[:])
			if st, rb, err := b.upload(hash, body, true); err != nil || st != http.StatusOK {
				return fmt.Errorf("upload: %d %s %v", st, rb, err)
			}
			res, err := b.run("base", steps(hash))
			if err != nil {
				return err
			}
			if res == "ready" {
				defer s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/templates/"+b.templateID, nil)
			}
			return check(res)
		}}
	}
	canary := filepath.Join(os.TempDir(), "agentbox-outside-canary")
	os.Remove(canary)
	attacks = append(attacks,
		attack{sideBuild, "upload whose bytes do not match the hash in its link", func(t *testing.T) error {
			b, err := requestBuild(ctx, t, s, s.OtherKey, "outside-hash")
			if err != nil {
				return err
			}
			lie := strings.Repeat("5e", 32)
			st, body, err := b.upload(lie, secret, true)
			if err != nil {
				return err
			}
			if st/100 == 2 {
				return crossed("upload accepted under hash %s", lie)
			}
			if st != http.StatusBadRequest || !strings.Contains(string(body), lie) {
				return fmt.Errorf("refused without naming the hash: %d %s", st, body)
			}
			return nil
		}},
		buildAttack("COPY of a context symlink to /etc/shadow",
			[]tar.Header{{Name: "shadow", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}},
			func(h string) []map[string]any {
				return []map[string]any{{"type": "COPY", "args": []string{"shadow", "/copied-shadow"}, "filesHash": h}}
			},
			func(res string) error {
				if res != "ready" {
					return nil // refused outright: fine too
				}
				// Built: the layer must hold a link (the sandbox's own
				// /etc/shadow), never the host's file.
				host, _ := os.ReadFile("/etc/shadow")
				found, leaked := false, false
				_ = filepath.WalkDir(filepath.Join(s.TemplateDir, "layers"), func(p string, d os.DirEntry, err error) error {
					if err == nil && d.Name() == "copied-shadow" {
						found = true
						if fi, _ := os.Lstat(p); fi != nil && fi.Mode().IsRegular() {
							b, _ := os.ReadFile(p)
							leaked = leaked || bytes.Equal(b, host)
						}
					}
					return nil
				})
				switch {
				case leaked:
					return crossed("the host's /etc/shadow was copied into a template layer")
				case !found:
					return fmt.Errorf("built, but the copied link is not in any layer")
				}
				return nil
			}),
		buildAttack("COPY through a context symlink to /etc",
			[]tar.Header{{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
			func(h string) []map[string]any {
				return []map[string]any{{"type": "COPY", "args": []string{"etc/shadow", "/stolen"}, "filesHash": h}}
			},
			func(res string) error {
				if res == "ready" {
					return crossed("COPY etc/shadow through a link to /etc succeeded")
				}
				return nil
			}),
		buildAttack("context archive with ../ entries",
			[]tar.Header{{Name: "../../../../../../../.." + canary, Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "escaped"}, {Name: "ok.txt", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "ok"}},
			func(h string) []map[string]any {
				return []map[string]any{{"type": "COPY", "args": []string{".", "/ctx/"}, "filesHash": h}}
			},
			func(res string) error {
				if _, err := os.Stat(canary); err == nil {
					os.Remove(canary)
					return crossed("the archive wrote %s on the host", canary)
				}
				if res == "ready" {
					return crossed("a context with ../ entries built")
				}
				return nil
			}),
	)
	runAttacks(t, attacks)
}
