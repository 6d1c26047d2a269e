package harness

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// Suite is one server shared by every test of a package: the first test that
// asks starts it, TestMain stops it after m.Run.
//
//	var suite = harness.NewSuite("e2e", harness.Args("--health-interval", "5s"))
//
//	func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }
//
//	func TestX(t *testing.T) { s := suite.Server(t); ... }
type Suite struct {
	name string
	opts []Option

	once sync.Once
	srv  *Server
	err  error
}

// NewSuite names the suite (for the instance hash) and configures its server.
func NewSuite(name string, opts ...Option) *Suite {
	return &Suite{name: name, opts: opts}
}

// Server returns the suite's server, starting it on first use. It skips t
// in -short mode and without root, and fails it when the server did not
// start. When t fails, the server log written during t is printed.
func (p *Suite) Server(t testing.TB) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	RequireRoot(t)
	p.once.Do(func() {
		cfg := config{name: p.name}
		for _, o := range append(p.opts, Name(p.name)) {
			o(&cfg)
		}
		p.srv, p.err = start(cfg)
	})
	if p.err != nil {
		if p.srv != nil {
			t.Fatalf("start agentbox serve: %v\n%s", p.err, p.srv.LogTail(100))
		}
		t.Fatalf("start agentbox serve: %v", p.err)
	}
	s := p.srv
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("----- agentbox serve log %s (last 150 lines) -----\n%s", s.LogPath, s.LogTail(150))
		}
	})
	return s
}

// Run runs the tests and tears the server down; its result is the exit code.
func (p *Suite) Run(m *testing.M) int {
	code := m.Run()
	if p.srv != nil {
		if err := p.srv.teardown(); err != nil {
			fmt.Fprintf(os.Stderr, "harness: teardown of %s: %v\n", p.srv.Instance, err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}
