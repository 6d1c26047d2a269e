package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/testutil"
	"github.com/agentbox/agentbox/internal/volume"
)

func TestVolumeMountsValidation(t *testing.T) {
	s := &Server{MaxBody: 1 << 20}
	many := make([]string, 17)
	for i := range many {
		many[i] = `{"name":"v","path":"/m` + strings.Repeat("x", i+1) + `"}`
	}
	for _, tc := range []struct {
		name, mounts, wantErr string
	}{
		{"one", `[{"name":"ws","path":"/workspace"}]`, ""},
		{"two side by side", `[{"name":"a","path":"/data/a"},{"name":"b","path":"/data/b"}]`, ""},
		{"same volume twice", `[{"name":"a","path":"/x"},{"name":"a","path":"/y"}]`, ""},
		{"under tmp", `[{"name":"a","path":"/tmp/work"}]`, ""},
		{"bad name", `[{"name":"a b","path":"/x"}]`, "volumeMounts[0].name"},
		{"empty name", `[{"name":"","path":"/x"}]`, "volumeMounts[0].name"},
		{"no path", `[{"name":"a"}]`, "volumeMounts[0].path: required"},
		{"relative", `[{"name":"a","path":"x"}]`, "must be absolute"},
		{"dotdot", `[{"name":"a","path":"/x/../etc"}]`, "must be clean"},
		{"trailing slash", `[{"name":"a","path":"/x/"}]`, "must be clean"},
		{"double slash", `[{"name":"a","path":"//x"}]`, "must be clean"},
		{"root", `[{"name":"a","path":"/"}]`, "root"},
		{"proc", `[{"name":"a","path":"/proc"}]`, "volumeMounts[0].path: /proc"},
		{"under sys", `[{"name":"a","path":"/sys/fs/x"}]`, "/sys"},
		{"dev", `[{"name":"a","path":"/dev/shm"}]`, "/dev"},
		{"envd", `[{"name":"a","path":"/.agentbox/bin"}]`, "/.agentbox"},
		{"resolv.conf", `[{"name":"a","path":"/etc/resolv.conf"}]`, "/etc/resolv.conf"},
		{"control char", `[{"name":"a","path":"/x\ny"}]`, "printable"},
		{"same path", `[{"name":"a","path":"/x"},{"name":"b","path":"/x"}]`, "volumeMounts[1].path: /x is also"},
		{"nested", `[{"name":"a","path":"/x"},{"name":"b","path":"/x/y"}]`, "inside one another"},
		{"nested reversed", `[{"name":"a","path":"/x/y"},{"name":"b","path":"/x"}]`, "inside one another"},
		{"too many", `[` + strings.Join(many, ",") + `]`, "over the limit of 16"},
		{"wrong type", `[{"name":1,"path":"/x"}]`, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := decodeString(t, `{"templateID":"base","volumeMounts":`+tc.mounts+`}`, 1<<20)
			if err == nil {
				_, err = s.createRequest(context.Background(), b, true)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || httperr.Status(err) != http.StatusBadRequest {
				t.Fatalf("error %v (status %d) does not name %q", err, httperr.Status(err), tc.wantErr)
			}
		})
	}
	b, _ := decodeString(t, `{"templateID":"base","volumeMounts":[{"name":"ws","path":"/workspace"},{"name":"ws","path":"/w2"}]}`, 1<<20)
	req, err := s.createRequest(context.Background(), b, true)
	if err != nil || len(req.VolumeMounts) != 2 || req.VolumeMounts[1].Name != "ws" || req.VolumeMounts[1].Path != "/w2" {
		t.Fatalf("request %+v %v", req.VolumeMounts, err)
	}
}

// volumeAPI is the API with a real store and volume service (root: each
// volume is a loop-mounted filesystem) and two teams.
type volumeAPI struct {
	h          http.Handler
	keyA, keyB string
}

func newVolumeAPI(t *testing.T) *volumeAPI {
	t.Helper()
	testutil.RequireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	vols, err := volume.New(ctx, volume.Config{Dir: filepath.Join(dir, "volumes"), DefaultSizeMB: 16, MaxSizeMB: 32}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vols.Close)
	a, _ := st.EnsureTeam(ctx, "a")
	b, _ := st.EnsureTeam(ctx, "b")
	keyA, _, _ := st.CreateAPIKey(ctx, a.ID, "")
	keyB, _, _ := st.CreateAPIKey(ctx, b.ID, "")
	s := New(slog.New(slog.DiscardHandler), st, nil, nil)
	s.SetVolumes(vols)
	// A limiter that never throttles: the test makes many wrong calls.
	s.SetAuthLimiter(authlimit.New(authlimit.Options{}))
	return &volumeAPI{h: s.Handler(), keyA: keyA, keyB: keyB}
}

// do calls the API; auth is "key:<key>" or "bearer:<token>".
func (v *volumeAPI) do(t *testing.T, method, path, auth string, body []byte) (int, []byte) {
	t.Helper()
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	switch kind, val, _ := strings.Cut(auth, ":"); kind {
	case "key":
		r.Header.Set("X-API-Key", val)
	case "bearer":
		r.Header.Set("Authorization", "Bearer "+val)
	}
	w := httptest.NewRecorder()
	v.h.ServeHTTP(w, r)
	out, _ := io.ReadAll(w.Body)
	return w.Code, out
}

func TestVolumeRoutes(t *testing.T) {
	v := newVolumeAPI(t)
	a, b := "key:"+v.keyA, "key:"+v.keyB
	st, body := v.do(t, "POST", "/volumes", a, []byte(`{"name":"ws"}`))
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	var va rest.VolumeAndToken
	if err := json.Unmarshal(body, &va); err != nil || va.VolumeID == "" || va.Token == "" || va.Name != "ws" || va.SizeMB != 16 {
		t.Fatalf("create answered %s", body)
	}
	st, body = v.do(t, "POST", "/volumes", b, []byte(`{"name":"ws","sizeMB":32}`))
	var vb rest.VolumeAndToken
	if st != 201 || json.Unmarshal(body, &vb) != nil {
		t.Fatalf("team b create: %d %s", st, body)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"name":"ws"}`, "409"},
		{`{"name":"a/b"}`, "400 name"},
		{`{}`, "400 name"},
		{`{"name":"big","sizeMB":33}`, "400 sizeMB"},
		{`{"name":"neg","sizeMB":-1}`, "400 sizeMB"},
		{`{"name":5}`, "400 name"},
	} {
		st, body := v.do(t, "POST", "/volumes", a, []byte(tc.body))
		code, field, _ := strings.Cut(tc.want, " ")
		if code != strconv.Itoa(st) || !strings.Contains(string(body), field) {
			t.Errorf("create %s: %d %s, want %s", tc.body, st, body, tc.want)
		}
	}
	// Listing shows only the team's own volumes.
	_, body = v.do(t, "GET", "/volumes", a, nil)
	var list []rest.Volume
	if err := json.Unmarshal(body, &list); err != nil || len(list) != 1 || list[0].VolumeID != va.VolumeID {
		t.Fatalf("team a lists %s", body)
	}
	// Another team's volume answers exactly as a missing one.
	const unknown = "00000000-0000-4000-8000-000000000000"
	for _, m := range []string{"GET", "DELETE"} {
		st1, b1 := v.do(t, m, "/volumes/"+va.VolumeID, b, nil)
		st2, b2 := v.do(t, m, "/volumes/"+unknown, b, nil)
		if st1 != 404 || st2 != 404 || !bytes.Equal(bytes.ReplaceAll(b1, []byte(va.VolumeID), []byte(unknown)), b2) {
			t.Errorf("team b %s team a's volume: %d %s; unknown: %d %s", m, st1, b1, st2, b2)
		}
	}
	if st, _ := v.do(t, "GET", "/volumes/"+va.VolumeID, a, nil); st != 200 {
		t.Fatalf("team a's volume after team b's attempts: %d", st)
	}
	if st, _ := v.do(t, "GET", "/volumes", "", nil); st != 401 {
		t.Fatalf("list without a key: %d", st)
	}

	// The content API: the volume's own token only.
	tok := "bearer:" + va.Token
	file := "/volumecontent/" + va.VolumeID + "/file?path=/hello.txt"
	if st, body := v.do(t, "PUT", file, tok, []byte("hi")); st != 201 || !strings.Contains(string(body), `"path":"/hello.txt"`) {
		t.Fatalf("put: %d %s", st, body)
	}
	if st, body := v.do(t, "GET", file, tok, nil); st != 200 || string(body) != "hi" {
		t.Fatalf("get: %d %s", st, body)
	}
	for name, auth := range map[string]string{
		"no token":                  "",
		"team a's API key (bearer)": "bearer:" + v.keyA,
		"team a's API key (header)": a,
		"team b's volume's token":   "bearer:" + vb.Token,
		"a tampered token":          "bearer:" + va.Token[:len(va.Token)-2] + "00",
		"garbage":                   "bearer:" + strings.Repeat("z", 300),
	} {
		for _, c := range []struct{ method, path string }{
			{"GET", file}, {"PUT", file + "&force=true"}, {"GET", "/volumecontent/" + va.VolumeID + "/dir?path=/"},
			{"DELETE", "/volumecontent/" + va.VolumeID + "/path?path=/hello.txt"},
		} {
			if st, body := v.do(t, c.method, c.path, auth, []byte("pwned")); st != 401 {
				t.Errorf("%s %s with %s: %d %s", c.method, c.path, name, st, body)
			}
		}
	}
	// Team b's token on team a's volume: 401 too, and team a's file is intact.
	if st, _ := v.do(t, "GET", "/volumecontent/"+va.VolumeID+"/file?path=/hello.txt", "bearer:"+vb.Token, nil); st != 401 {
		t.Fatalf("team b's token on team a's volume: %d", st)
	}
	if _, body := v.do(t, "GET", file, tok, nil); string(body) != "hi" {
		t.Fatalf("file after the attacks: %s", body)
	}
	// Paths stay in the volume.
	if st, body := v.do(t, "GET", "/volumecontent/"+va.VolumeID+"/file?path=/../../../../etc/passwd", tok, nil); st != 404 {
		t.Fatalf("../ read: %d %s", st, body)
	}
	if st, body := v.do(t, "GET", "/volumecontent/"+va.VolumeID+"/file", tok, nil); st != 400 || !strings.Contains(string(body), "path") {
		t.Fatalf("no path: %d %s", st, body)
	}
	if st, body := v.do(t, "PUT", file+"&uid=70000", tok, nil); st != 400 || !strings.Contains(string(body), "uid") {
		t.Fatalf("uid out of range: %d %s", st, body)
	}
	if st, body := v.do(t, "PUT", file+"&force=yes", tok, nil); st != 400 || !strings.Contains(string(body), "force") {
		t.Fatalf("bad force: %d %s", st, body)
	}
	// The rest of the content API, as the SDK calls it.
	dir := "/volumecontent/" + va.VolumeID + "/dir?path=/d/e&force=true&mode=448&uid=1000&gid=1000"
	if st, body := v.do(t, "POST", dir, tok, nil); st != 201 || !strings.Contains(string(body), `"mode":448`) || !strings.Contains(string(body), `"uid":1000`) {
		t.Fatalf("mkdir: %d %s", st, body)
	}
	if st, body := v.do(t, "GET", "/volumecontent/"+va.VolumeID+"/dir?path=/&depth=3", tok, nil); st != 200 {
		t.Fatalf("list: %d %s", st, body)
	} else {
		var ents []rest.VolumeEntryStat
		if err := json.Unmarshal(body, &ents); err != nil || len(ents) != 3 {
			t.Fatalf("list: %s %v", body, err)
		}
	}
	if st, body := v.do(t, "GET", "/volumecontent/"+va.VolumeID+"/dir?path=/empty", tok, nil); st != 404 {
		t.Fatalf("list missing: %d %s", st, body)
	}
	if st, body := v.do(t, "GET", "/volumecontent/"+va.VolumeID+"/dir?path=/d/e", tok, nil); st != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("list empty dir: %d %s", st, body)
	}
	path := "/volumecontent/" + va.VolumeID + "/path?path=/hello.txt"
	if st, body := v.do(t, "PATCH", path, tok, []byte(`{"mode":384,"uid":5}`)); st != 200 || !strings.Contains(string(body), `"mode":384`) || !strings.Contains(string(body), `"uid":5`) {
		t.Fatalf("patch: %d %s", st, body)
	}
	if st, body := v.do(t, "GET", path, tok, nil); st != 200 || !strings.Contains(string(body), `"type":"file"`) {
		t.Fatalf("stat: %d %s", st, body)
	}
	if st, body := v.do(t, "DELETE", path, tok, nil); st != 204 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if st, _ := v.do(t, "GET", path, tok, nil); st != 404 {
		t.Fatalf("stat after delete: %d", st)
	}
	if st, body := v.do(t, "DELETE", "/volumecontent/"+va.VolumeID+"/path?path=/", tok, nil); st != 400 {
		t.Fatalf("delete root: %d %s", st, body)
	}
	// Full: 507, and the volume keeps working.
	if st, body := v.do(t, "PUT", "/volumecontent/"+va.VolumeID+"/file?path=/big", tok, make([]byte, 20<<20)); st != 507 {
		t.Fatalf("past the size: %d %s", st, body)
	}

	// Deleting: the owner only; then its token is refused.
	if st, body := v.do(t, "DELETE", "/volumes/"+va.VolumeID, a, nil); st != 204 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if st, _ := v.do(t, "GET", file, tok, nil); st != 401 {
		t.Fatalf("token of a deleted volume: %d", st)
	}
	if st, _ := v.do(t, "GET", "/volumes/"+va.VolumeID, a, nil); st != 404 {
		t.Fatalf("deleted volume: %d", st)
	}
}
