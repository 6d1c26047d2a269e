package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestShutdownServers checks the SIGTERM path of the HTTP servers: a short
// request in flight finishes, a stream still running at the end of the
// grace is cut (its client gets an error, not a hang), and new connections
// are refused from the start.
func TestShutdownServers(t *testing.T) {
	tests := []struct {
		name    string
		stream  bool // a request that never ends by itself is in flight
		wantCut bool
	}{
		{name: "idle and short requests end within the grace", stream: false, wantCut: false},
		{name: "a stream past the grace is cut", stream: true, wantCut: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			entered := make(chan string, 2)
			release := make(chan struct{})
			mux := http.NewServeMux()
			mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
				entered <- "short"
				<-release
				_, _ = io.WriteString(w, "done")
			})
			mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
				w.(http.Flusher).Flush()
				entered <- "stream"
				<-r.Context().Done()
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: mux}
			go func() { _ = srv.Serve(ln) }()
			base := "http://" + ln.Addr().String()

			type res struct {
				body string
				err  error
			}
			get := func(path string) <-chan res {
				out := make(chan res, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						out <- res{err: err}
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					if errors.Is(ctx.Err(), context.DeadlineExceeded) {
						err = errors.New("hung until the client's deadline")
					}
					out <- res{string(b), err}
				}()
				return out
			}
			short := get("/short")
			<-entered
			var stream <-chan res
			if tc.stream {
				stream = get("/stream")
				<-entered
			}

			done := make(chan bool, 1)
			go func() {
				done <- shutdownServers([]*http.Server{srv}, 2*time.Second, nil, slog.New(slog.DiscardHandler))
			}()
			// New connections are refused once the shutdown has begun.
			for {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					break
				}
				_ = c.Close()
			}
			close(release)
			if r := <-short; r.err != nil || r.body != "done" {
				t.Errorf("short request: %q, %v; want it to finish", r.body, r.err)
			}
			if stream != nil {
				if r := <-stream; r.err == nil || r.err.Error() == "hung until the client's deadline" {
					t.Errorf("stream: %q, %v; want it cut with an error", r.body, r.err)
				}
			}
			if cut := <-done; cut != tc.wantCut {
				t.Errorf("shutdownServers cut = %v, want %v", cut, tc.wantCut)
			}
		})
	}
}
