package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The dashboard's envd calls reach the data plane as the browser's
// requests, routed to the sandbox's envd, and stream back as written.
func TestInProcessDataPlane(t *testing.T) {
	from := httptest.NewRequest(http.MethodGet, "/dashboard/api/sandboxes/sbx1/terminal", nil)
	from.RemoteAddr = "192.0.2.7:4242"
	from.Header.Set("X-Forwarded-For", "198.51.100.9")
	step := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, want := range map[string]string{"E2b-Sandbox-Id": "sbx1", "E2b-Sandbox-Port": "49983", "X-Forwarded-For": "198.51.100.9", "X-Access-Token": "tok"} {
			if got := r.Header.Get(k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
		if r.RemoteAddr != from.RemoteAddr || r.URL.Path != "/process.Process/Start" || r.URL.RawQuery != "a=b" {
			t.Errorf("request %s %s?%s", r.RemoteAddr, r.URL.Path, r.URL.RawQuery)
		}
		if b, err := io.ReadAll(r.Body); err != nil || string(b) != "{}" || r.ContentLength != -1 {
			t.Errorf("body %q (length %d), %v; want the streamed {} of unknown length", b, r.ContentLength, err)
		}
		w.Header().Set("X-Answer", "yes")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, "first;")
		<-step // the caller has read the first part before the rest is written
		_, _ = io.WriteString(w, "second")
		panic(http.ErrAbortHandler) // as a proxy cut short does
	})
	c := &http.Client{Transport: inProcess{h: h, from: from, id: "sbx1", port: 49983}}
	req, _ := http.NewRequest(http.MethodPost, "http://10.0.0.2:49983/process.Process/Start?a=b", io.NopCloser(strings.NewReader("{}")))
	req.Header.Set("X-Access-Token", "tok")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("X-Answer") != "yes" {
		t.Fatalf("answer %d %v", resp.StatusCode, resp.Header)
	}
	first := make([]byte, len("first;"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first;" {
		t.Fatalf("first part %q, %v", first, err)
	}
	close(step)
	rest, err := io.ReadAll(resp.Body)
	if string(rest) != "second" || err == nil {
		t.Fatalf("rest %q, %v; want \"second\" and an error for the aborted answer", rest, err)
	}
}

// A caller that closes the body unread (an upload's answer) does not cut
// the handler short: it finishes, as behind a real connection.
func TestInProcessUnreadAnswer(t *testing.T) {
	from := httptest.NewRequest(http.MethodPost, "/dashboard/api/sandboxes/sbx1/files", nil)
	finished := make(chan bool, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := w.Write([]byte(`[{"path":"/tmp/a"}]`))
		_, err2 := w.Write(make([]byte, 1<<20))
		finished <- err == nil && err2 == nil
	})
	c := &http.Client{Transport: inProcess{h: h, from: from, id: "sbx1", port: 49983}}
	resp, err := c.Post("http://10.0.0.2:49983/files", "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !<-finished {
		t.Fatal("the handler's writes failed after the caller closed the answer")
	}
}
