package envd

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestInitStartsTemplateCommandOnce(t *testing.T) {
	e := newTestEnv(t, "")
	out := filepath.Join(e.root, "started")
	body := map[string]any{
		"envVars":        map[string]string{"FROM_INIT": "yes"},
		"defaultWorkdir": e.home,
		// Appends one line per run: a second /init must not start it again.
		"startCmd": `echo "$(id -u) $FROM_INIT $(pwd)" >> ` + out + `; echo to-log`,
	}
	for range 2 {
		resp := e.do(http.MethodPost, "/init", jsonBody(body), nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("init: %s", resp.Status)
		}
	}
	want := "0 yes " + e.home + "\n"
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(out)
		if string(b) == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("start command wrote %q, want %q", b, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a second run would have shown up by now
	if b, _ := os.ReadFile(out); string(b) != want {
		t.Errorf("ran more than once: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(e.root, "log", "start.log")); !strings.Contains(string(b), "to-log") {
		t.Errorf("start.log %q", b)
	}
}
