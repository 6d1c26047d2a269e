package e2e

import (
	"os"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// suite is the one server every test of the package talks to.
var suite = harness.NewSuite("e2e")

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// server is the suite's server with a key of a second team.
type server struct {
	*harness.Server
	otherKey string
}

var other struct {
	once sync.Once
	key  string
}

// need gates a test on root and on a running server.
func need(t *testing.T) *server {
	t.Helper()
	s := suite.Server(t)
	other.once.Do(func() { other.key = s.NewKey(t, "other") })
	if other.key == "" {
		t.Fatal("no key for the second team")
	}
	return &server{Server: s, otherKey: other.key}
}

func (s *server) client() *wire.Client { return wire.New(s.URL, s.APIKey) }

// env is the environment the E2B SDKs and our CLI read, plus the second
// team's key for e2e/js.
func (s *server) env() []string {
	return append(s.Env(s.APIKey), "E2E_OTHER_API_KEY="+s.otherKey)
}
