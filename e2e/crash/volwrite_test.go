package crash

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/volume"
)

// The volume-write rows replace a small file with a large one through the
// content API, which promises the old file or the whole new one.
const (
	volWriteOld  = "old content\n"
	volWriteSize = 16 << 20
)

func volWriteNew() []byte {
	return bytes.Repeat([]byte("new content 0123456789abcdef\n"), volWriteSize/29+1)[:volWriteSize]
}

// volumeContent calls the volume content API of f's volume.
func (r *rig) volumeContent(f fixture, method, route, query string, body []byte) (int, []byte) {
	req, err := http.NewRequestWithContext(r.ctx, method, r.URL+"/volumecontent/"+f.volumeID+"/"+route+"?"+query, bytes.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+f.volumeToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func volumeWrite() operation {
	return operation{
		setup: func(t *testing.T, r *rig) fixture {
			st, b := r.do("POST", "/volumes", map[string]any{"name": "crash", "sizeMB": 64})
			var v struct{ VolumeID, Token string }
			if st != http.StatusCreated || json.Unmarshal(b, &v) != nil {
				t.Fatalf("setup volume: %d %s", st, b)
			}
			f := fixture{volume: "crash", volumeID: v.VolumeID, volumeToken: v.Token}
			// The old file is written from a sandbox: a write through the
			// content API would meet the row's crash point.
			sb, err := r.c.Create(r.ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900, VolumeMounts: []wire.VolumeMount{{Name: f.volume, Path: "/mnt/v"}}})
			if err != nil {
				t.Fatalf("setup mount: %v", err)
			}
			if res, err := r.c.Run(r.ctx, sb, "user", "printf '"+strings.TrimSuffix(volWriteOld, "\n")+"\\n' > /mnt/v/a.txt"); err != nil || res.ExitCode != 0 {
				t.Fatalf("setup write: %v %+v", err, res)
			}
			if err := r.c.Kill(r.ctx, sb.SandboxID); err != nil {
				t.Fatalf("setup kill: %v", err)
			}
			return f
		},
		trigger: func(r *rig, f fixture) {
			r.volumeContent(f, "PUT", "file", "path=/a.txt&force=true", volWriteNew())
		},
	}
}

// checkVolumeWrite checks what a crash in a replacing write left: the file
// is the old one or the whole new one, the volume lists nothing else, and
// its filesystem holds no more than the file (no staged copy counted
// against the volume's size that no listing shows).
func checkVolumeWrite(t *testing.T, r *rig, point sandbox.CrashStep, f fixture) {
	t.Helper()
	if point.Op != volume.OpWrite {
		return
	}
	st, got := r.volumeContent(f, "GET", "file", "path=/a.txt", nil)
	switch {
	case st != http.StatusOK:
		t.Fatalf("read /a.txt after the restart: %d %.200s", st, got)
	case string(got) != volWriteOld && !bytes.Equal(got, volWriteNew()):
		t.Errorf("/a.txt after the restart is neither the old file nor the whole new one: %d bytes", len(got))
	}
	st, b := r.volumeContent(f, "GET", "dir", "path=/", nil)
	var ents []struct {
		Name string `json:"name"`
	}
	if st != http.StatusOK || json.Unmarshal(b, &ents) != nil {
		t.Fatalf("list the volume after the restart: %d %s", st, b)
	}
	if len(ents) != 1 || ents[0].Name != "a.txt" {
		t.Errorf("the volume lists %+v after the restart, want a.txt only", ents)
	}
	sb, err := r.c.Create(r.ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900, VolumeMounts: []wire.VolumeMount{{Name: f.volume, Path: "/mnt/v"}}})
	if err != nil {
		t.Fatalf("mount the volume after the restart: %v", err)
	}
	res, err := r.c.Run(r.ctx, sb, "user", "df -B1 --output=used /mnt/v | tail -1")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("df in the volume: %v %+v", err, res)
	}
	used, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
	if err != nil {
		t.Fatalf("df in the volume: %q", res.Stdout)
	}
	// The filesystem's own metadata (journal, tables) is under half the
	// body; a staged copy left behind is a whole body more.
	if extra := used - int64(len(got)); extra > volWriteSize/2 {
		t.Errorf("the volume's filesystem uses %d bytes for a %d-byte file: %d bytes no file shows", used, len(got), extra)
	}
}
